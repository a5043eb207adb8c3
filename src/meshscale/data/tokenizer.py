"""Tokenizers: a Hugging Face `tokenizer.json` read by the `tokenizers` library, or a byte-level BPE trained
here on the user's own text (GPT-2's recipe: bytes mapped to printable characters, so any text encodes and
nothing is unknown)."""

from collections.abc import Iterable
from pathlib import Path

from meshscale.errors import UserError

# End-of-document tokens in the order they are looked for when --eos is not given.
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>", "[SEP]")
DEFAULT_EOS = "<|endoftext|>"


class Tokenizer:
    """A `tokenizers.Tokenizer` and the id of the token that ends each document."""

    def __init__(self, inner, eos: str | None = None, source: str = "tokenizer"):
        self.inner, self.source = inner, source
        names = (eos,) if eos else EOS_NAMES
        found = [(n, inner.token_to_id(n)) for n in names if inner.token_to_id(n) is not None]
        if not found:
            tried = f"--eos {eos!r}" if eos else f"none of {', '.join(EOS_NAMES)}"
            raise UserError(f"{source}: {tried} is a token of this tokenizer; name its end-of-document token "
                            "with --eos TOKEN")
        self.eos, self.eos_id = found[0]
        self.vocab = inner.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens: the end-of-document token is the packer's to add."""
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets: twice the speed, same ids
        encode = getattr(self.inner, "encode_batch_fast", self.inner.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.inner.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: str | Path) -> None:
        self.inner.save(str(path))


def load_tokenizer(path: str | Path, eos: str | None = None) -> Tokenizer:
    """A tokenizer.json, or a directory holding one (a Hugging Face model directory)."""
    from tokenizers import Tokenizer as Inner

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise UserError(f"--tokenizer {path}: no tokenizer.json there; pass a tokenizer.json file or a directory "
                        "holding one (train one with `meshscale data tokenizer`)")
    try:
        inner = Inner.from_file(str(p))
    except Exception as e:  # the Rust library raises a bare Exception for every parse failure
        raise UserError(f"--tokenizer {p}: not a tokenizers-library tokenizer.json "
                        f"({str(e).splitlines()[0]})") from None
    return Tokenizer(inner, eos, str(p))


def train_bpe(texts: Iterable[str], vocab: int, eos: str = DEFAULT_EOS) -> Tokenizer:
    """A byte-level BPE of `vocab` tokens (256 bytes, `eos`, then merges) learned from `texts`."""
    from tokenizers import Tokenizer as Inner, decoders, models, pre_tokenizers, trainers

    if vocab < 257:
        raise UserError(f"--vocab {vocab}: a byte-level BPE needs at least 257 tokens (256 bytes and {eos})")
    inner = Inner(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[eos], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    inner.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(inner, eos, "trained BPE")
