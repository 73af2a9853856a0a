"""mode serve: the explorer as an OpenAI-compatible proxy whose traffic becomes training data.

An agent in any language points its OpenAI client at the proxy, sends its conversations (one
session id per episode), then a reward (`POST /feedback`) and `POST /commit`; the proxy turns each
session into experiences from the token ids the engine saw and writes them to the experience
buffer, grouped by the agent's task id, for a `mode: train` trainer. docs/serve.md is the manual.

- protocol.py: OpenAI request parsing and validation, response and stream-chunk building (pure);
- chains.py: how a session's completions link into experiences with assistant-only masks (pure);
- history.py: the durable record (SQLite): sessions, completions, rewards, committed groups;
- feedback.py: /feedback and /commit rules over the history, group writes to the buffer;
- gate.py / weights.py: one version per request, new weights loaded between requests;
- core.py: the completion path (render, link, generate, record);
- streaming.py: `stream: true`, each token's text sent as the engine samples it;
- app.py: the HTTP layer (aiohttp): routes, auth, TLS, limits, JSON errors;
- process.py: the explorer process in mode serve.
"""
