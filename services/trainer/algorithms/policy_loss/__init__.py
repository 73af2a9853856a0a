"""Policy losses: (batch, logprob, **args) -> (scalar loss, metrics). Built-ins are listed in ../parts.py."""
