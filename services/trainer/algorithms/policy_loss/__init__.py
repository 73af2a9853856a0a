"""Policy losses: tensor functions and their batch forms, fn(batch, logprob, **args) -> (scalar loss,
metrics), built by adapter.batch_loss. Built-ins are listed in ../parts.py."""
