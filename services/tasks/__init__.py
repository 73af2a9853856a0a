"""Task generators: synthetic tasksets written as JSON lines (`question` / `answer` columns).

- `arith.py`: zero-padded additions and subtractions for the tiny from-scratch model of the CPU demo.
- `chat_arith.py`: the chat model's LaTeX additions (`make demo-llm`, SmolLM2-135M).

Replies to them are read by the explorer's one answer reader, services/explorer/rewards/answers.py.
"""
