"""Advantage functions: (batch, **args) -> AdvantageOutput. Built-ins are listed in ../parts.py."""
