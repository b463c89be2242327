"""The tokenizer of a HuggingFace-layout model folder, over the `tokenizers` library."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import tokenizers

from openinfer_core.errors import TokenizerError, TooManyTokensError
from openinfer_core.text.chat_template import ChatTemplate

if TYPE_CHECKING:
    from openinfer_core.interfaces.chat import ChatEncoder

_DEFAULT_TEMPLATE_NAME = "default"
_TOOL_TEMPLATE_NAME = "tool_use"


class Tokenizer:
    """Text <-> token ids, special tokens, end-of-sequence ids and the chat template.

    Chat prompts come from `chat_encoder` when one is given (a model line's own renderer,
    `interfaces.chat.ChatEncoder`), else from the checkpoint's chat template.

    Read-only after construction. The underlying `tokenizers.Tokenizer` may be called from
    several threads at once.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos_token: bool = False,
        eos_token_ids: Sequence[int] = (),
        chat_templates: Mapping[str, str] | None = None,
        chat_encoder: ChatEncoder | None = None,
        pad_token: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._backend = backend
        self.chat_encoder = chat_encoder
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.pad_token = pad_token
        # tokenizer_config.json as read (empty without one), for clients that ask for it.
        self.config: Mapping[str, Any] = MappingProxyType(dict(config or {}))
        self._bos_id = backend.token_to_id(bos_token) if bos_token is not None else None
        self._add_bos = add_bos_token and self._bos_id is not None
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self._templates = {
            name: ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
            for name, source in (chat_templates or {}).items()
        }
        specials = {i for i, tok in backend.get_added_tokens_decoder().items() if tok.special}
        for token in (bos_token, eos_token):
            token_id = backend.token_to_id(token) if token is not None else None
            if token_id is not None:
                specials.add(token_id)
        self.all_special_ids: frozenset[int] = frozenset(specials)

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str], *,
                 chat_encoder: ChatEncoder | None = None) -> Tokenizer:
        """Load tokenizer.json plus the optional tokenizer_config.json, chat_template.jinja,
        generation_config.json and config.json from a model folder. `chat_encoder`: the model
        line's chat renderer, which then replaces the folder's chat template."""
        folder = Path(path)
        if not folder.is_dir():
            raise TokenizerError(
                f"tokenizer folder {folder} does not exist or is not a directory; "
                "pass the model folder that holds tokenizer.json"
            )
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(_missing_tokenizer_message(folder))
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # the Rust side raises a bare Exception on malformed files
            raise TokenizerError(
                f"{tokenizer_file} could not be loaded by the tokenizers library: {e}; "
                "re-download it, or upgrade `tokenizers` if the file is from a newer version"
            ) from e

        config = _read_json(folder / "tokenizer_config.json")
        bos_token = _token_content(config.get("bos_token"))
        eos_token = _token_content(config.get("eos_token"))
        templates = _chat_templates(folder, config)

        eos_ids: list[int] = _id_list(_read_json(folder / "generation_config.json"))
        tokenizer_eos = backend.token_to_id(eos_token) if eos_token is not None else None
        if tokenizer_eos is not None:
            eos_ids.append(tokenizer_eos)
        if not eos_ids:
            eos_ids = _id_list(_read_json(folder / "config.json"))
        return cls(
            backend,
            bos_token=bos_token,
            eos_token=eos_token,
            add_bos_token=bool(config.get("add_bos_token", False)),
            eos_token_ids=list(dict.fromkeys(eos_ids)),
            chat_templates=templates,
            chat_encoder=chat_encoder,
            pad_token=_token_content(config.get("pad_token")),
            config=config,
        )

    # -- ids <-> text ----------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, *,
               max_tokens: int | None = None) -> list[int]:
        """Token ids of `text`. Special tokens written in the text become their ids.

        The GIL is released while the text is split (about a second a megabyte), so other
        threads run meanwhile. With `max_tokens`, a text of more tokens raises
        `TooManyTokensError` before its ids are made into a list (which holds the GIL, about
        40 ns an id)."""
        # encode_batch, not encode: only the batch call lets go of the GIL.
        encoding = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        if max_tokens is not None and len(encoding) > max_tokens:
            raise TooManyTokensError(len(encoding), max_tokens)
        ids: list[int] = encoding.ids
        # add_bos_token asks for a BOS that tokenizer.json's post-processor may or may not add.
        if add_special_tokens and self._add_bos and (not ids or ids[0] != self._bos_id):
            assert self._bos_id is not None
            ids.insert(0, self._bos_id)
        if max_tokens is not None and len(ids) > max_tokens:
            raise TooManyTokensError(len(ids), max_tokens)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        result: str = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return result

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        """The vocabulary strings of `ids` (byte-level BPE shows e.g. a space as 'Ġ');
        None for an id outside the vocabulary."""
        return [self._backend.id_to_token(i) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        result: int | None = self._backend.token_to_id(token)
        return result

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included. The model's embedding
        table may be larger (padded)."""
        size: int = self._backend.get_vocab_size(with_added_tokens=True)
        return size

    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._backend

    # -- chat ------------------------------------------------------------------------------

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The default chat template, or None when the model ships none."""
        if _DEFAULT_TEMPLATE_NAME in self._templates:
            return self._templates[_DEFAULT_TEMPLATE_NAME]
        return next(iter(self._templates.values()), None)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for a conversation. Keyword arguments (tools, enable_thinking, ...)
        are passed to the chat encoder or the template."""
        if self.chat_encoder is not None:
            return self.chat_encoder.render(
                messages, add_generation_prompt=add_generation_prompt, **template_kwargs)
        template = self.chat_template
        if template_kwargs.get("tools") and _TOOL_TEMPLATE_NAME in self._templates:
            template = self._templates[_TOOL_TEMPLATE_NAME]
        if template is None:
            raise TokenizerError(
                "this model has no chat template (none in tokenizer_config.json and no "
                "chat_template.jinja); send a plain completion prompt instead, or add a template"
            )
        return template.render(
            messages, add_generation_prompt=add_generation_prompt, **template_kwargs
        )


def _missing_tokenizer_message(folder: Path) -> str:
    message = f"{folder}: tokenizer.json is missing; openinfer reads the fast-tokenizer file."
    if (folder / "tokenizer.model").is_file():
        return message + (
            " The folder has a SentencePiece tokenizer.model; convert it once with transformers: "
            "AutoTokenizer.from_pretrained(folder).save_pretrained(folder)"
        )
    if any(folder.glob("*.tiktoken")):
        return message + (
            " The folder has a .tiktoken rank file; convert it with "
            "openinfer_core.text.tiktoken_bpe.tiktoken_to_tokenizer_json"
        )
    return message + " Download the model's tokenizer.json into this folder."


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path} is not readable JSON: {e}; re-download or fix it") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _token_content(value: Any) -> str | None:
    """bos_token / eos_token are written either as a string or as {"content": "..."}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _id_list(config: Mapping[str, Any]) -> list[int]:
    value = config.get("eos_token_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _chat_templates(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """Named template sources. chat_template.jinja, when present, is the default template,
    as in transformers."""
    templates: dict[str, str] = {}
    raw = config.get("chat_template")
    if isinstance(raw, str):
        templates[_DEFAULT_TEMPLATE_NAME] = raw
    elif isinstance(raw, list):
        for entry in raw:
            if not (
                isinstance(entry, Mapping)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                raise TokenizerError(
                    f"{folder / 'tokenizer_config.json'}: chat_template list entries must be "
                    '{"name": ..., "template": ...} objects'
                )
            templates[entry["name"]] = entry["template"]
    elif raw is not None:
        raise TokenizerError(
            f"{folder / 'tokenizer_config.json'}: chat_template must be a string or a list of "
            f"named templates, got {type(raw).__name__}"
        )
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        templates[_DEFAULT_TEMPLATE_NAME] = jinja_file.read_text(encoding="utf-8")
    return templates
