"""Load tokenizers and causal LMs: from the hub, a local directory, or built in (no download).

`model_path` is one of
- a hub id or a local directory (anything `AutoModelForCausalLM.from_pretrained` accepts), including
  a directory written by `save_model` (checkpoints);
- `builtin:<name>`, a tiny model built locally and deterministically from a seed, so tests and the
  CPU demo never touch the network. The explorer and the trainer build it separately and must agree
  bit for bit: the weights depend only on (name, seed, torch version), never on the process.

Builtin names (all share one character-level tokenizer, `builtin_tokenizer()`):

| name                | architecture                                    | parameters |
| ------------------- | ----------------------------------------------- | ---------- |
| `builtin:tiny-arith`| GPT-2, 3 layers, hidden 128, 4 heads, 256 pos.  | ~0.6 M     |
| `builtin:tiny-30m`  | GPT-2, 9 layers, hidden 512, 8 heads, 1024 pos. | ~28.9 M    |

Dropout is 0 in both so that logprobs computed by the explorer and the trainer agree. The
tokenizer maps each printable ASCII character (and newline) to one token, plus `<pad>`, `<bos>`,
`<eos>`, `<unk>`; it adds no special tokens on encode (prompts are exactly their characters), and
its chat template concatenates the message contents, so chat-style workflows see the raw question.

Heavy libraries (torch, transformers, tokenizers) are imported inside functions so that importing
this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import TYPE_CHECKING, Any

from services.common.errors import InvalidArgument

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

BUILTIN_PREFIX = "builtin:"
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII and newline: enough for arithmetic and short English prompts.
CHARACTERS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


@dataclasses.dataclass(frozen=True)
class BuiltinSpec:
    """Shape of a builtin GPT-2 model; the vocabulary always comes from the builtin tokenizer."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int


BUILTINS: dict[str, BuiltinSpec] = {
    "tiny-arith": BuiltinSpec(n_layer=3, n_embd=128, n_head=4, n_positions=256),
    "tiny-30m": BuiltinSpec(n_layer=9, n_embd=512, n_head=8, n_positions=1024),
}


def is_builtin(path: str | None) -> bool:
    """True for `builtin:<name>` paths (whether or not the name exists)."""
    return bool(path) and str(path).startswith(BUILTIN_PREFIX)


def builtin_spec(path: str) -> BuiltinSpec:
    """The spec of `builtin:<name>`; an unknown name is an InvalidArgument listing the known ones."""
    name = path[len(BUILTIN_PREFIX) :]
    if name not in BUILTINS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTINS)
        raise InvalidArgument(f"unknown builtin model {path!r}; known: {known}", field="model.model_path")
    return BUILTINS[name]


def builtin_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer of every builtin model (ids: specials 0-3, then characters)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # One token per character, newline included ([\s\S] rather than ".", which skips "\n").
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=max(spec.n_positions for spec in BUILTINS.values()),
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def load_tokenizer(model_path: str, tokenizer_path: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer at `tokenizer_path` (default `model_path`): builtin, hub id or directory."""
    path = tokenizer_path or model_path
    if is_builtin(path):
        builtin_spec(path)  # reject unknown names early
        return builtin_tokenizer()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def _torch_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in names:
        raise InvalidArgument(f"dtype {dtype!r} not one of auto, {', '.join(names)}", field="model.dtype")
    return names[dtype]


def build_builtin(path: str, *, seed: int = 42) -> PreTrainedModel:
    """Build `builtin:<name>` in float32 with weights drawn from `seed`; the global RNG is untouched."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    spec = builtin_spec(path)
    tok = builtin_tokenizer()
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=spec.n_positions,
        n_embd=spec.n_embd,
        n_layer=spec.n_layer,
        n_head=spec.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model


def load_causal_lm(
    model_path: str, *, dtype: str = "auto", device: str = "cpu", seed: int = 42
) -> PreTrainedModel:
    """A causal LM in eval mode on `device`; `seed` only matters for builtin models."""
    torch_dtype = _torch_dtype(dtype, device)
    if is_builtin(model_path):
        model = build_builtin(model_path, seed=seed)
        model.to(torch_dtype)  # nn.Module.to converts in place
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype)
    model.to(device)  # type: ignore[arg-type]  # transformers wraps `to`; mypy misreads it
    model.eval()
    return model


def context_length(model: PreTrainedModel) -> int | None:
    """Positions the model can attend over (max_position_embeddings / n_positions / n_ctx), if it says."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str | pathlib.Path
) -> pathlib.Path:
    """Write weights (safetensors), config and tokenizer so `load_causal_lm(directory)` reloads them."""
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(model: PreTrainedModel) -> int:
    """Number of parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
