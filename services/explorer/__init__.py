"""The explorer service: runs workflows on inference engines and writes experiences to the buffer.

Layout (gRPC-free core, thin server):
- `workflows/` Task / Workflow (Trinity's API) and the built-ins: simple, math, countdown, arith
  (the embedded demo), and a multi-turn environment workflow; `rewards/` reward functions and the
  one answer reader (`rewards/answers.py`);
  `plugins.py` imports the plugin directories (the registries: services/common/registry.py).
- `engines/` one InferenceEngine interface: transformers (default, CPU/GPU) and vLLM (optional);
  `BatchingEngine` merges concurrent requests; `weights.py` loads published weights.
- `model_wrapper.py` what a workflow calls (chat / generate, sync and async, OpenAI client,
  history); `openai_server.py` the loopback OpenAI-compatible API.
- `runner.py` concurrent runners with timeouts and retries; `pipeline/` experience operators;
  `eval.py` mean@k / best@k; `explorer.py` the step loop; `weight_sync.py` synchronizer plumbing;
  `build.py` construction from the config; `server.py` the gRPC service + loop.
"""
