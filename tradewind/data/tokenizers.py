"""Tokenizers: the built-in byte tokenizer and Hugging Face `tokenizer.json` files and folders.

Every tokenizer has an EOS id (the cache puts one after each document) and a fingerprint, the sha256 of
its definition, so that a token cache records exactly which tokenizer made it.

A Hugging Face folder (a model's, or what `save_pretrained` writes) may hold, beside `tokenizer.json`,
`tokenizer_config.json` (its `bos_token`, `eos_token` and other named special tokens, and its
`chat_template`), `chat_template.jinja` (the template, as newer transformers write it) and
`special_tokens_map.json`; `HFTokenizer.from_folder` reads them, and `render_chat` renders messages with the
template (see `chat.py`). A `tokenizer.json` named alone is read alone.

Example:
    tokenizer = load_tokenizer("byte")       # or "path/to/tokenizer.json", its folder, or "hf:gpt2" (needs the hub)
                                             # or a bucket's: "gs://bucket/tok/tokenizer.json", "s3://bucket/tok"
    ids = tokenizer.encode_batch(["To be, or not to be"])[0]
    write_hf_tokenizer_files(tokenizer, Path("exports/r1"))  # loads with transformers.AutoTokenizer
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tokenizers as hf

from tradewind.core import InvalidInputError, NotFoundError, atomic_write_json, atomic_write_text
from tradewind.core.buckets import is_remote, remote_fs, scheme_of
from tradewind.core.files import open_regular
from tradewind.data.byte_level import byte_symbols
from tradewind.data.chat import ChatTemplate, Messages, message_problem
from tradewind.data.fast_bpe import FastBPE, build_fast_encoder, fast_bpe_enabled, library_versions

# Tried in order when a tokenizer.json does not say which token ends a document.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
HUB_PREFIX = "hf:"
# The names the byte tokenizer's EOS and BOS get in its Hugging Face form.
BYTE_EOS_TOKEN = "<|endoftext|>"
BYTE_BOS_TOKEN = "<|begin_of_text|>"
_UNDECIDED = object()  # HFTokenizer._fast before the fast encoder has been tried
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
# What transformers calls the named special tokens, which a chat template sees as variables.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@runtime_checkable
class Tokenizer(Protocol):
    """What the data layer needs from a tokenizer.

    Attributes:
        name: a short label (`"byte"`, or the tokenizer file's path).
        vocab_size: ids are in `[0, vocab_size)`.
        bos_id: the begin-of-sequence id, or None if the tokenizer has none.
        eos_id: the end-of-sequence id, placed after every document in a token cache.
        fingerprint: sha256 hex of the tokenizer's definition.
    """

    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int
    fingerprint: str

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; special tokens are dropped."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0-255 are bytes, 256 is EOS, 257 is BOS (vocabulary of 258).

    Needs no files and never fails, so it is the default for small experiments.
    """

    name = "byte"
    vocab_size = 258
    eos_id = 256
    bos_id = 257
    chat_template = None  # `render_chat` refuses
    # The definition is fixed, so its fingerprint is the hash of a description of it.
    fingerprint = hashlib.sha256(b"tradewind byte tokenizer v1: utf-8 bytes 0-255, eos 256, bos 257").hexdigest()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The UTF-8 bytes of each text, as ids."""
        return [list(text.encode("utf-8")) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Decode byte ids as UTF-8 (invalid sequences become U+FFFD); EOS, BOS and anything else
        outside 0-255 is dropped."""
        array = np.asarray(ids, dtype=np.int64)
        return array[(array >= 0) & (array < 256)].astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def render_chat(self, messages: Messages, add_generation_prompt: bool = False) -> str:
        """Refused: the byte tokenizer has no chat template.

        Raises:
            InvalidInputError: always, saying what to use instead.
        """
        raise InvalidInputError(_no_chat_template(self.name))

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = False) -> list[int]:
        """Refused, as `render_chat`."""
        raise InvalidInputError(_no_chat_template(self.name))

    def hf_definition(self) -> str:
        """The same tokenizer as a Hugging Face `tokenizer.json`: byte-level BPE without merges.

        Each byte is one symbol of the byte-level alphabet (GPT-2's byte-to-character table) whose id is
        the byte's value, so any text encodes to its UTF-8 bytes; EOS and BOS are special tokens 256 and
        257. Regex splitting is off, as it would only split words that no merge could join anyway.
        """
        vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
        tokenizer = hf.Tokenizer(hf.models.BPE(vocab=vocab, merges=[]))
        tokenizer.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = hf.decoders.ByteLevel()
        tokenizer.add_special_tokens(
            [hf.AddedToken(BYTE_EOS_TOKEN, special=True), hf.AddedToken(BYTE_BOS_TOKEN, special=True)]
        )
        return tokenizer.to_str()

    def __repr__(self) -> str:
        return "ByteTokenizer()"


def _no_chat_template(name: str) -> str:
    return (
        f"tokenizer {name!r} has no chat template; use a Hugging Face tokenizer folder whose {CONFIG_FILE} (or "
        f"{CHAT_TEMPLATE_FILE}) has one, such as a chat model's folder"
    )


@dataclass(frozen=True)
class HFTokenizerConfig:
    """What a Hugging Face tokenizer folder says beside its `tokenizer.json`.

    Attributes:
        chat_template: `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template` (its `default`
            when it holds named templates), or None.
        special_tokens: the named special tokens (`bos_token`, `eos_token`, ...) the folder sets, as
            transformers reads them (`special_tokens_map.json` over the config when the config has no
            `added_tokens_decoder`); None where one is set to null.
    """

    chat_template: str | None = None
    special_tokens: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_files(cls, files: Mapping[str, bytes], where: str) -> HFTokenizerConfig:
        """Parse the files of a folder (name -> bytes; any may be missing).

        Raises:
            InvalidInputError: a file is not the JSON object it should be, or a token or template is not text.
        """
        config = _json_object(files, CONFIG_FILE, where)
        in_config = [name for name in SPECIAL_TOKEN_NAMES if name in config]
        specials = {name: _token_text(config[name], name, f"{where}/{CONFIG_FILE}") for name in in_config}
        if "added_tokens_decoder" not in config:
            mapped = _json_object(files, SPECIAL_TOKENS_FILE, where)
            for name in SPECIAL_TOKEN_NAMES:
                if name in mapped:
                    specials[name] = _token_text(mapped[name], name, f"{where}/{SPECIAL_TOKENS_FILE}")
        if CHAT_TEMPLATE_FILE in files:
            template = files[CHAT_TEMPLATE_FILE].decode("utf-8", errors="replace")
        else:
            template = config.get("chat_template")
            if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
                named = {item.get("name"): item.get("template") for item in template if isinstance(item, dict)}
                template = named.get("default")
            if template is not None and not isinstance(template, str):
                kind = type(template).__name__
                raise InvalidInputError(f"{where}/{CONFIG_FILE}: chat_template is a {kind}, expected text")
        return cls(chat_template=template, special_tokens=specials)


def _json_object(files: Mapping[str, bytes], name: str, where: str) -> dict[str, Any]:
    if name not in files:
        return {}
    try:
        value = json.loads(files[name])
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidInputError(f"{where}/{name}: not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{where}/{name}: a JSON {type(value).__name__}, expected an object")
    return value


def _token_text(value: Any, name: str, where: str) -> str | None:
    """A special token as a config writes it: its text, an AddedToken-like object with `content`, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise InvalidInputError(f"{where}: {name} is a {type(value).__name__}, expected a token's text")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from a `tokenizer.json` file (or, with `from_folder`, from a
    folder that may also hold its config and chat template).

    A byte-level BPE (as `train_bpe_tokenizer` makes) is encoded by `tiktoken` when that gives the same
    ids, several times faster; `encoder` says which library is used, and `TRADEWIND_FAST_BPE=0` forces
    `tokenizers` (see `tradewind.data.fast_bpe`).

    Args:
        path: the `tokenizer.json` file.
        eos_token: the token that ends a document; else the folder config's `eos_token`, else detected from
            common names (`<|endoftext|>`, `</s>`, `<eos>`, `[SEP]`). BOS is the config's `bos_token` in a
            folder, else detected from common names (`<|begin_of_text|>`, `<s>`, `<bos>`, `[CLS]`).

    Attributes:
        config: what the folder says beside `tokenizer.json`; None for a `tokenizer.json` alone.
        chat_template: the chat template, or None.

    Raises:
        NotFoundError: no file at `path`.
        InvalidInputError: the file is not a tokenizer, `eos_token` (or a config's BOS or EOS) is not in its
            vocabulary, or no EOS token could be detected.
    """

    def __init__(
        self,
        path: str | Path,
        eos_token: str | None = None,
        *,
        _data: bytes | None = None,
        _config: HFTokenizerConfig | None = None,
    ):
        if _data is None:
            try:
                _data = Path(path).read_bytes()
            except FileNotFoundError:
                raise NotFoundError(f"no tokenizer file at {path}") from None
        try:
            self._tokenizer = hf.Tokenizer.from_str(_data.decode("utf-8"))
        except Exception as error:  # the Rust library raises plain Exception subclasses
            raise InvalidInputError(f"{path}: not a valid tokenizer.json: {error}") from None
        self.name = str(path)
        self.config = _config
        self.chat_template = _config.chat_template if _config is not None else None
        specials = _config.special_tokens if _config is not None else {}
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        eos_source = "eos_token" if eos_token is not None else f"{CONFIG_FILE}'s eos_token"
        self.eos_id = self._find_eos(path, eos_token or specials.get("eos_token"), eos_source)
        detected_bos = self._first_id(BOS_CANDIDATES)
        # A folder's BOS is the one its config names (none if it names none), as transformers reads it.
        bos_token = specials.get("bos_token")
        self.bos_id = detected_bos if _config is None else self._token_id(path, bos_token, f"{CONFIG_FILE}'s bos_token")
        # The EOS id decides the cache's separators, so it is part of the tokenizer's identity; so are what a
        # folder adds to its tokenizer.json: a BOS other than the detected one, and the chat template with the
        # tokens it renders. A tokenizer.json alone keeps the fingerprint it always had.
        variables = {name: token for name, token in specials.items() if token is not None}  # the template's
        extra: dict[str, Any] = {}
        if self.bos_id != detected_bos:
            extra["bos"] = self.bos_id
        if self.chat_template is not None:
            extra["chat_template"] = self.chat_template
            extra["special_tokens"] = variables
        suffix = ("\n" + json.dumps(extra, sort_keys=True)).encode() if extra else b""
        self.fingerprint = hashlib.sha256(_data + f"\neos={self.eos_id}".encode() + suffix).hexdigest()
        self._definition = (_data, eos_token)
        self._chat = ChatTemplate(self.chat_template, variables) if self.chat_template is not None else None
        self._fast: FastBPE | object | None = _UNDECIDED
        self._fast_checked: str | None = None  # library versions under which the fast path's probes passed

    @classmethod
    def from_folder(cls, folder: str | Path, eos_token: str | None = None) -> HFTokenizer:
        """The tokenizer of a Hugging Face folder: its `tokenizer.json` with what `tokenizer_config.json`,
        `chat_template.jinja` and `special_tokens_map.json` say, where present. A folder with `tokenizer.json`
        alone gives the tokenizer of that file (named by it).

        Raises:
            NotFoundError: no `tokenizer.json` in `folder`.
            InvalidInputError: as `HFTokenizer`, or a config file is malformed.
        """
        folder = Path(folder)
        read = lambda name: _read_local(folder / name)  # noqa: E731 - one line, used once
        return _from_files(str(folder), read, eos_token, str(folder / TOKENIZER_FILE))

    @classmethod
    def from_hub(cls, name: str, eos_token: str | None = None) -> HFTokenizer:
        """The tokenizer of Hugging Face Hub model `name` (e.g. `gpt2`); needs the hub to be reachable.

        Raises:
            NotFoundError: the hub cannot be reached or has no tokenizer for `name`.
        """
        try:
            data = hf.Tokenizer.from_pretrained(name).to_str().encode("utf-8")
        except Exception as error:  # network and hub errors come as plain Exceptions from the Rust side
            raise NotFoundError(f"cannot load tokenizer {name!r} from the Hugging Face Hub: {error}") from None
        return cls(f"hf:{name}", eos_token, _data=data)

    def _first_id(self, tokens: Sequence[str]) -> int | None:
        return next((i for t in tokens if (i := self._tokenizer.token_to_id(t)) is not None), None)

    def _token_id(self, path: str | Path, token: str | None, source: str) -> int | None:
        if token is None:
            return None
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise InvalidInputError(f"{path}: {source} {token!r} is not in the tokenizer's vocabulary")
        return token_id

    def _find_eos(self, path: str | Path, eos_token: str | None, source: str) -> int:
        if eos_token is not None:
            return self._token_id(path, eos_token, source)
        eos_id = self._first_id(EOS_CANDIDATES)
        if eos_id is not None:
            return eos_id
        raise InvalidInputError(
            f"{path}: cannot tell which token ends a document (none of {', '.join(EOS_CANDIDATES)} is in the "
            f"vocabulary); pass eos_token with the tokenizer's end-of-text token"
        )

    @property
    def encoder(self) -> str:
        """Which library encodes: `"tiktoken"` when this tokenizer is a byte-level BPE that tiktoken was
        checked to encode identically (see `tradewind.data.fast_bpe`), else `"tokenizers"`."""
        return "tokenizers" if self._fast_encoder() is None else "tiktoken"

    def _fast_encoder(self) -> FastBPE | None:
        # Decided once per object; a restored copy in a worker skips the probes when the sending process
        # ran them under the same library versions (`_fast_checked`).
        if self._fast is _UNDECIDED:
            self._fast = None
            if fast_bpe_enabled():
                checked = self._fast_checked is not None and self._fast_checked == library_versions()
                self._fast = build_fast_encoder(self._definition[0].decode("utf-8"), self._tokenizer, checked=checked)
        return self._fast

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        fast = self._fast_encoder()
        if fast is not None:
            return fast.encode_batch(texts)
        # `encode_batch_fast` skips the character offsets (`encode_with_offsets` gives them, for a chat's loss mask).
        return [encoding.ids for encoding in self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; special tokens are dropped."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Each text's ids (as `encode_batch`) and each id's character span `[start, end)` in the text."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [(encoding.ids, encoding.offsets) for encoding in encodings]

    def render_chat(self, messages: Messages, add_generation_prompt: bool = False) -> str:
        """`messages` rendered with this tokenizer's chat template, as transformers'
        `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` renders them.

        Args:
            messages: `[{"role": "system" | "user" | "assistant", "content": str}, ...]`, non-empty.
            add_generation_prompt: end with the text that opens an assistant reply (for sampling one).

        Raises:
            InvalidInputError: no chat template, or a malformed message (the message says which and why).
            ChatTemplateError: the template raised on these messages (an `InvalidInputError` too).
        """
        if self._chat is None:
            raise InvalidInputError(_no_chat_template(self.name))
        problem = message_problem(list(messages))
        if problem is not None:
            raise InvalidInputError(f"messages: {problem}")
        return self._chat.render(messages, add_generation_prompt)

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = False) -> list[int]:
        """The ids of `render_chat(messages, add_generation_prompt)`, encoded without adding special tokens
        (the template writes its own), as `apply_chat_template(messages, tokenize=True)` gives them.

        Raises:
            InvalidInputError: as `render_chat`.
        """
        return self.encode_batch([self.render_chat(messages, add_generation_prompt)])[0]

    def hf_definition(self) -> str:
        """The `tokenizer.json` this tokenizer was loaded from, unchanged (so its fingerprint carries over)."""
        return self._definition[0].decode("utf-8")

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r})"

    def __reduce__(self) -> tuple:
        # Shard tasks carry the tokenizer to worker processes, one pickle per task; rebuilding it from
        # JSON costs tens of milliseconds, so a worker keeps the ones it has built, by fingerprint.
        # The fast encoder is decided here, once, so that workers need not run its probes again.
        data, eos_token = self._definition
        checked = None
        if self._fast_encoder() is not None:
            checked = library_versions()
        return _restore_hf_tokenizer, (self.name, data, eos_token, self.fingerprint, checked, self.config)


_RESTORED: dict[tuple[str, str, str | None, str | None], HFTokenizer] = {}


def _restore_hf_tokenizer(
    name: str,
    data: bytes,
    eos_token: str | None,
    fingerprint: str,
    fast_checked: str | None = None,
    config: HFTokenizerConfig | None = None,
) -> HFTokenizer:
    # The fingerprint covers what the config changes (BOS, the chat template and its tokens).
    key = (fingerprint, name, eos_token, fast_checked)
    if key not in _RESTORED:
        _RESTORED.clear()  # one tokenizer per build; keep memory flat across builds
        _RESTORED[key] = tokenizer = HFTokenizer(name, eos_token, _data=data, _config=config)
        tokenizer._fast_checked = fast_checked
    return _RESTORED[key]


_SIDE_FILES = (CONFIG_FILE, CHAT_TEMPLATE_FILE, SPECIAL_TOKENS_FILE)


def _from_files(where: str, read: Callable[[str], bytes | None], eos_token: str | None, file_name: str) -> HFTokenizer:
    """The tokenizer of the folder `where` whose files `read(name)` gives (None: no such file); named `where`
    when it has a file beside `tokenizer.json`, else `file_name` (the tokenizer.json, as it was always named)."""
    data = read(TOKENIZER_FILE)
    if data is None:
        raise NotFoundError(f"no {TOKENIZER_FILE} in the tokenizer folder {where}")
    files = {name: content for name in _SIDE_FILES if (content := read(name)) is not None}
    if not files:
        return HFTokenizer(file_name, eos_token, _data=data)
    return HFTokenizer(where, eos_token, _data=data, _config=HFTokenizerConfig.from_files(files, where))


def _read_local(path: Path) -> bytes | None:
    if not (path.exists() or path.is_symlink()):
        return None
    with open_regular(path) as file:  # what is there, a FIFO or a hard link, is refused
        return file.read()


def load_tokenizer(spec: str, eos_token: str | None = None) -> Tokenizer:
    """The tokenizer that `spec` names.

    Args:
        spec: `"byte"` for the byte tokenizer; `"hf:<name>"` for a Hugging Face Hub tokenizer (needs
            the hub); else a path or a bucket URL (`gs://`, `s3://`) to a `tokenizer.json` file, read alone,
            or to a Hugging Face folder that holds one (with its config and chat template, if any: see
            `HFTokenizer.from_folder`).
        eos_token: passed to `HFTokenizer` for tokenizer files whose EOS token is not detected.

    Returns:
        The tokenizer.

    Raises:
        NotFoundError: nothing at the path, or a folder without `tokenizer.json`.
        InvalidInputError: the file is not a usable tokenizer.
    """
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith(HUB_PREFIX):
        return HFTokenizer.from_hub(spec.removeprefix(HUB_PREFIX), eos_token=eos_token)
    if is_remote(spec):
        return _load_remote_tokenizer(spec, eos_token)
    path = Path(spec).expanduser()
    looked_for = path / TOKENIZER_FILE if path.is_dir() else path
    if not looked_for.is_file():
        raise NotFoundError(
            f"no tokenizer at {spec!r} (expected 'byte', a tokenizer.json file, a folder containing one, "
            f"or '{HUB_PREFIX}<name>' for a Hugging Face Hub tokenizer; looked for {looked_for})"
        )
    if path.is_dir():
        return HFTokenizer.from_folder(path, eos_token)
    return HFTokenizer(path, eos_token=eos_token)


def _load_remote_tokenizer(url: str, eos_token: str | None) -> HFTokenizer:
    """The tokenizer of the `tokenizer.json` at bucket URL `url`, or of the folder it names (with the files
    beside it, as `from_folder`); named `url`."""
    fs, path = remote_fs(url)

    def read(file: str) -> bytes | None:
        try:
            return fs.cat_file(file)
        except FileNotFoundError:
            return None

    if path.endswith(".json"):
        data = read(path)
        if data is None:
            raise NotFoundError(f"no tokenizer at {url!r} (looked for {scheme_of(url)}://{path})")
        return HFTokenizer(url, eos_token, _data=data)
    folder = path.rstrip("/")
    return _from_files(url, lambda name: read(f"{folder}/{name}"), eos_token, url)


def write_hf_tokenizer_files(
    tokenizer: ByteTokenizer | HFTokenizer, directory: str | Path, *, model_max_length: int | None = None
) -> None:
    """Write `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json` into `directory`.

    `transformers.AutoTokenizer.from_pretrained(directory)` then loads a tokenizer whose
    `encode(text, add_special_tokens=False)` gives `tokenizer`'s ids, whose EOS and BOS tokens are
    `tokenizer.eos_id` and `tokenizer.bos_id`, and whose chat template and other named special tokens are
    those of the folder `tokenizer` was loaded from; the `tokenizers` library reads `tokenizer.json` alone.
    `load_tokenizer(directory)` gives a tokenizer of the same fingerprint.

    Args:
        tokenizer: the tokenizer to write.
        directory: an existing folder (a Hugging Face model folder, typically).
        model_max_length: the longest input the model takes, recorded for `transformers`.
    """
    definition = tokenizer.hf_definition()
    token = hf.Tokenizer.from_str(definition).id_to_token
    named = tokenizer.config.special_tokens if isinstance(tokenizer, HFTokenizer) and tokenizer.config else {}
    specials = {"eos_token": token(tokenizer.eos_id)}
    if tokenizer.bos_id is not None:
        specials["bos_token"] = token(tokenizer.bos_id)
    specials |= {name: text for name, text in named.items() if text is not None and name not in specials}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        # transformers would otherwise drop the space in " ." and " 's" when decoding.
        "clean_up_tokenization_spaces": False,
        # The byte tokenizer reads "<|endoftext|>" typed in a document as 13 bytes, where `tokenizers`
        # would read it as EOS unless told to split special tokens; HFTokenizer reads it as `tokenizers` does.
        "split_special_tokens": isinstance(tokenizer, ByteTokenizer),
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    directory = Path(directory)
    atomic_write_text(directory / "tokenizer.json", definition)
    atomic_write_json(directory / "tokenizer_config.json", config)
    atomic_write_json(directory / "special_tokens_map.json", specials)
