"""Trinity v0.6's research Connect-the-Dots (CoD) workflows: a pack of related tasks solved in turn,
with a `Hints:` block the model rewrites between them (docs/workflows.md, "Connect the Dots").

pack.py packs a step's tasks and runs a pack (CodPackWorkflow); hints.py is the hint-update
episode; episode.py the multi-step base of the environments; each environment has its module.
"""
