r"""The GRT and the dense baseline as Hugging Face ``transformers`` classes (``pip install -e ".[hf]"``); importing
this module registers them with the Auto factories (usage: the README's Hugging Face section).

The configs keep the project config in ``project_config`` and derive the usual fields.  ``self.model`` IS the
project's module: without cache or padding ``forward`` calls it (the logits bit for bit); otherwise it runs
:func:`lm.sample.cached_forward` (exact inside the window; past it the window is re-read, as ``lm.sample`` does).
The tokenizer is UTF-8 bytes; ``"\n"`` doubles as BOS/EOS/PAD, is never added to an encoding, is kept by decoding,
and neither stops generation nor counts as padding.  HF softmaxes in float32, ``lm.sample`` in float64.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lm.models import DEPTH_KEY, build_model, config_from_dict, config_to_dict, default_model_config, kind_of
from lm.sample import KVCache, cached_forward
from rmsgauge.corpus import VOCAB_SIZE

try:
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        GenerationMixin,
        PretrainedConfig,
        PreTrainedModel,
    )
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from transformers.tokenization_python import AddedToken, PreTrainedTokenizer
except ImportError as e:  # the extra is optional: say which one to install
    raise ModuleNotFoundError(f"lm.hf_classes needs the Hugging Face extra: pip install -e \".[hf]\" ({e})") from e

NEWLINE_ID = 10  # "\n": BOS/EOS/PAD of the byte tokenizer (see the module docstring)
# generate() runs to max_new_tokens and never takes a "\n" byte for padding or the end, like lm.sample
GENERATION_DEFAULTS = {"do_sample": False, "bos_token_id": NEWLINE_ID, "pad_token_id": None, "eos_token_id": None}


class _ProjectHFConfig(PretrainedConfig):
    kind = ""  # "grt" / "dense" (a class attribute, not a config field)

    # transformers >= 5 configs are dataclasses: fields here, derivation in __post_init__
    project_config: dict | None = None  # the GRTConfig / DenseConfig as a dict; None: the CPU preset
    vocab_size: int = VOCAB_SIZE
    max_position_embeddings: int = 0  # = block_size (lm-eval reads it as the context length)
    hidden_size: int = 0
    num_attention_heads: int = 0
    num_hidden_layers: int = 0
    bos_token_id: int | None = NEWLINE_ID
    pad_token_id: int | None = NEWLINE_ID
    eos_token_id: int | None = NEWLINE_ID
    tie_word_embeddings: bool = False  # the project ties inside its own module; HF must not tie anything

    def __post_init__(self, **kwargs: Any) -> None:
        # HF also builds a config with no arguments (defaults, diffs): the CPU preset stands in
        pc = config_to_dict(default_model_config(self.kind)) if self.project_config is None else self.project_config
        cfg = config_from_dict(self.kind, dict(pc))  # validates: unknown keys and bad values fail here
        self.project_config = config_to_dict(cfg)
        # derived from project_config, whatever a saved config.json says
        self.vocab_size = cfg.vocab_size
        self.max_position_embeddings = cfg.block_size
        self.hidden_size = cfg.d_model
        self.num_attention_heads = cfg.n_heads
        self.num_hidden_layers = getattr(cfg, DEPTH_KEY[self.kind])
        self.tie_word_embeddings = False
        super().__post_init__(**kwargs)


class GRTHFConfig(_ProjectHFConfig):
    model_type = "rmsgauge-grt"
    kind = "grt"


class DenseHFConfig(_ProjectHFConfig):
    model_type = "rmsgauge-dense"
    kind = "dense"


class _ProjectForCausalLM(PreTrainedModel, GenerationMixin):
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = []

    def __init__(self, config: _ProjectHFConfig, model: nn.Module | None = None) -> None:
        super().__init__(config)
        self.kind = config.kind
        self.model = model or build_model(self.kind, config_from_dict(self.kind, config.project_config))
        self.generation_config = GenerationConfig(**GENERATION_DEFAULTS)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        # the project module initializes itself in its constructor; from_pretrained then loads every tensor
        return

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model brings its own KVCache (see the module docstring)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.tok_emb if self.kind == "dense" else self.model.embed

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: KVCache | None = None,
                labels: torch.Tensor | None = None, use_cache: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any) -> CausalLMOutputWithPast:
        if input_ids is None:
            raise ValueError("input_ids is required (the models read byte ids, not embeddings)")
        cache = kwargs.pop("past_key_values", None) if cache is None else cache  # the older transformers name
        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        block = self.config.max_position_embeddings
        if past + T > block:
            raise ValueError(f"cached length {past} + new tokens {T} must be in [1, block_size={block}]; "
                             "generate() re-reads the window itself, a direct call must crop")
        mask = (torch.ones(B, past + T, dtype=torch.long, device=input_ids.device) if attention_mask is None
                else attention_mask.to(input_ids.device).long())
        if mask.shape != (B, past + T):
            raise ValueError(f"attention_mask must be [B, past + T] = [{B}, {past + T}], got {tuple(mask.shape)}")
        if position_ids is None:
            # a left-padded row starts at position 0 at its first real token (lm.sample never pads)
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        position_ids = position_ids.to(input_ids.device)
        plain = bool(mask.all()) and torch.equal(position_ids, torch.arange(T, device=input_ids.device).expand(B, T))
        if cache is None and not use_cache and plain:
            logits, _ = self.model(input_ids)  # the project's own forward: its logits exactly
        else:
            if cache is None and use_cache:
                cache = KVCache(self.config.num_hidden_layers)
            q_idx = torch.arange(past, past + T, device=input_ids.device)
            k_idx = torch.arange(past + T, device=input_ids.device)
            allowed = (k_idx[None, :] <= q_idx[:, None])[None] & mask.bool()[:, None, :]  # (B, T, past+T)
            # a padding query sees no real key; letting it see itself keeps its (unused) row finite
            allowed = allowed | (k_idx[None, :] == q_idx[:, None])[None]
            logits = cached_forward(self.model, input_ids, cache, positions=position_ids, allowed=allowed[:, None])
        loss = None
        if labels is not None:
            # HF convention: labels are the inputs; position t predicts label t+1; -100 is ignored
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1).to(logits.device), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, next_sequence_length: int | None = None,
                                      cache: KVCache | None = None,
                                      attention_mask: torch.Tensor | None = None, **kwargs: Any) -> dict[str, Any]:
        block = self.config.max_position_embeddings
        use_cache = kwargs.get("use_cache", True)
        past = cache.get_seq_length() if cache is not None else 0
        if past and input_ids.shape[1] <= block:
            ids = input_ids[:, past:]  # the cache holds everything before
        else:
            if cache is not None:
                cache.reset()  # the window slid: no cached entry is valid any more (module docstring)
            ids = input_ids[:, -block:]
            if attention_mask is not None:
                attention_mask = attention_mask[:, -block:]
        return {"input_ids": ids, "attention_mask": attention_mask, "cache": cache, "use_cache": use_cache}


class GRTForCausalLM(_ProjectForCausalLM):
    config_class = GRTHFConfig


class DenseForCausalLM(_ProjectForCausalLM):
    config_class = DenseHFConfig


HF_CLASSES = {"grt": (GRTHFConfig, GRTForCausalLM), "dense": (DenseHFConfig, DenseForCausalLM)}


class ByteTokenizer(PreTrainedTokenizer):
    """UTF-8 bytes as ids 0..255 (= :func:`rmsgauge.corpus.encode`); ``"\\n"`` doubles as BOS/EOS/PAD."""

    vocab_files_names: ClassVar[dict[str, str]] = {}  # nothing to store: the vocabulary is the 256 bytes
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]

    def __init__(self, **kwargs: Any) -> None:
        nl = AddedToken("\n", special=True, normalized=False, lstrip=False, rstrip=False)
        self._added_tokens_decoder = {NEWLINE_ID: nl}
        for key in ("bos_token", "eos_token", "pad_token"):
            kwargs[key] = nl
        kwargs.setdefault("clean_up_tokenization_spaces", False)  # bytes round-trip exactly
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(VOCAB_SIZE)}

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [chr(b) for b in text.encode("utf-8")]  # one latin-1 character per byte

    def _convert_token_to_id(self, token: str) -> int:
        if len(token) != 1 or ord(token) >= VOCAB_SIZE:
            raise ValueError(f"a byte token is one character with code in [0, 255], got {token!r}")
        return ord(token)

    def _convert_id_to_token(self, index: int) -> str:
        return chr(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(ord(t) for t in tokens).decode("utf-8", errors="replace")  # as rmsgauge.corpus.decode

    def _decode(self, token_ids: int | list[int], skip_special_tokens: bool = False, **kwargs: Any) -> str:
        # every id is a real byte: "\n" is text even when asked to skip special tokens
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        return bytes(ids).decode("utf-8", errors="replace")

    def build_inputs_with_special_tokens(self, token_ids_0: list[int],
                                         token_ids_1: list[int] | None = None) -> list[int]:
        return list(token_ids_0) + list(token_ids_1 or [])  # the models were trained on raw bytes

    def get_special_tokens_mask(self, token_ids_0: list[int], token_ids_1: list[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        return [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        return ()


def register() -> None:
    """Register both model families with the Auto factories (idempotent; done on import)."""
    for cfg_cls, model_cls in HF_CLASSES.values():
        AutoConfig.register(cfg_cls.model_type, cfg_cls, exist_ok=True)
        AutoModelForCausalLM.register(cfg_cls, model_cls, exist_ok=True)
        AutoTokenizer.register(cfg_cls, tokenizer_class=ByteTokenizer, exist_ok=True)


register()


def wrap(model: nn.Module) -> _ProjectForCausalLM:
    """The HF model around an in-memory project module (shares its parameters, no copy)."""
    cfg_cls, model_cls = HF_CLASSES[kind_of(model)]
    hf = model_cls(cfg_cls(project_config=config_to_dict(model.config)), model=model)
    hf.config.dtype = next(model.parameters()).dtype  # what save_pretrained records (the project trains in float32)
    return hf


def load_pretrained(model_dir: str | os.PathLike, **kwargs: Any) -> _ProjectForCausalLM:
    """``AutoModelForCausalLM.from_pretrained`` (registration is this module's import)."""
    return AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
