"""`make test-gpu`: one command that tells a user with a GPU whether this project works on it.

    python -m scripts.gpu_check [--cpu] [--require-cuda] [--only a,b] [--skip c] [--out PATH] [--list]

Each check prints PASS/FAIL/SKIP with its figures; the JSON summary goes to --out, else $OUT, else
runs/gpu_check/gpu_check.json; the exit code is 1 when any check failed. Without a CUDA device the
CUDA-only checks SKIP and the rest run on CPU. docs/gpu.md says what each check asserts.
"""
