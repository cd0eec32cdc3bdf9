"""The llama2.c tokenizer (``tokenizer.bin``: SentencePiece pieces with scores, byte fallback ``<0xNN>``),
read without SentencePiece: greedy merges by score as llama2.c's ``encode``, exact ``decode``.
:data:`BOS_ID` / :data:`EOS_ID` are llama2.c's fixed special ids.  Used by :mod:`.llama2c` and the LM
tools' codecs."""

from __future__ import annotations

import heapq
import os
import re
from pathlib import Path

import numpy as np
from torch import Tensor

from ..errors import InputError

BOS_ID = 1
EOS_ID = 2

_BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")


class Llama2cTokenizer:
    """The llama2.c tokenizer (SentencePiece BPE with byte fallback, exported by llama2.c).

    Pieces are kept as bytes; a leading space in a piece is a real space (SentencePiece's ``▁``).
    """

    def __init__(self, pieces: list[bytes], scores: list[float], max_token_length: int = 0) -> None:
        if len(pieces) != len(scores):
            raise ValueError("pieces and scores differ in length")
        self.pieces = pieces
        self.scores = scores
        self.max_token_length = max_token_length
        self.piece_to_id: dict[bytes, int] = {}
        for i, p in enumerate(pieces):
            self.piece_to_id.setdefault(p, i)
        self.byte_to_id: dict[int, int] = {}
        self.id_to_byte: dict[int, int] = {}
        for i, p in enumerate(pieces):
            m = _BYTE_PIECE.fullmatch(p)
            if m:
                self.byte_to_id.setdefault(int(m.group(1), 16), i)
                self.id_to_byte[i] = int(m.group(1), 16)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @classmethod
    def from_file(cls, path: str | os.PathLike, vocab_size: int) -> Llama2cTokenizer:
        """Read ``tokenizer.bin``: int32 max_token_length, then per token float32 score, int32 length,
        ``length`` UTF-8 bytes.  The file must hold exactly ``vocab_size`` tokens."""
        path = Path(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(
                f"cannot read tokenizer {path}: {exc.strerror or exc}", "check the --tokenizer path"
            ) from None
        fix = "pass the llama2.c tokenizer .bin that belongs to the model (same vocab_size)"
        if len(raw) < 4:
            raise InputError(f"tokenizer {path} is truncated: expected at least 4 bytes, found {len(raw)}", fix)
        max_len = int(np.frombuffer(raw, "<i4", 1, 0)[0])
        pieces: list[bytes] = []
        scores: list[float] = []
        pos = 4
        for i in range(vocab_size):
            if pos + 8 > len(raw):
                raise InputError(
                    f"tokenizer {path} is truncated at token {i} of {vocab_size}: expected "
                    f"at least {pos + 8} bytes, found {len(raw)}",
                    fix,
                )
            score = float(np.frombuffer(raw, "<f4", 1, pos)[0])
            n = int(np.frombuffer(raw, "<i4", 1, pos + 4)[0])
            pos += 8
            if n < 0 or pos + n > len(raw):
                raise InputError(
                    f"tokenizer {path} is truncated or malformed at token {i}: piece of "
                    f"{n} bytes at offset {pos}, file has {len(raw)} bytes",
                    fix,
                )
            pieces.append(raw[pos : pos + n])
            scores.append(score)
            pos += n
        if pos != len(raw):
            raise InputError(
                f"tokenizer {path} has {len(raw) - pos} bytes after its {vocab_size} "
                f"tokens (expected {pos} bytes, found {len(raw)})",
                fix,
            )
        return cls(pieces, scores, max_len)

    def _char_tokens(self, text: str) -> list[int]:
        """One token per character, or its UTF-8 byte tokens when the character is not a piece."""
        ids: list[int] = []
        for ch in text:
            b = ch.encode("utf-8")
            tid = self.piece_to_id.get(b)
            if tid is not None:
                ids.append(tid)
                continue
            for byte in b:
                if byte not in self.byte_to_id:
                    raise InputError(
                        f"character {ch!r} has no token and the tokenizer has no byte token <0x{byte:02X}>",
                        "use a tokenizer with byte fallback",
                    )
                ids.append(self.byte_to_id[byte])
        return ids

    def _merge(self, ids: list[int]) -> list[int]:
        """Repeatedly merge the adjacent pair whose concatenation is the highest-scoring piece
        (leftmost on ties), as llama2.c does; a heap with lazy invalidation keeps it near-linear."""
        n = len(ids)
        tok = list(ids)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap: list[tuple[float, int, int, int, int, int]] = []

        def push(i: int) -> None:
            j = nxt[i] if 0 <= i < n else n
            if i < 0 or j >= n:
                return
            merged = self.piece_to_id.get(self.pieces[tok[i]] + self.pieces[tok[j]])
            if merged is not None and self.scores[merged] > -1e10:
                heapq.heappush(heap, (-self.scores[merged], i, j, tok[i], tok[j], merged))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, j, ti, tj, merged = heapq.heappop(heap)
            if not (alive[i] and alive[j] and nxt[i] == j and tok[i] == ti and tok[j] == tj):
                continue  # stale entry
            tok[i] = merged
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            push(prv[i])
            push(i)
        return [t for t, a in zip(tok, alive) if a]

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """Token ids of ``text`` the way llama2.c encodes it.

        BOS (id 1) first when ``bos``; a space is prepended to non-empty text; then each character maps
        to its token (or its UTF-8 byte tokens) and pairs are merged by score.  EOS (id 2) last when
        ``eos``.
        """
        ids = [BOS_ID] if bos else []
        if text:
            ids += self._merge(self._char_tokens(" " + text))
        if eos:
            ids.append(EOS_ID)
        return ids

    def decode_piece(self, prev: int | None, token: int) -> bytes:
        """Bytes of ``token`` following ``prev``: leading space stripped after BOS, ``<0xNN>`` -> byte."""
        if token in self.id_to_byte:
            return bytes([self.id_to_byte[token]])
        piece = self.pieces[token]
        if prev == BOS_ID and piece.startswith(b" "):
            piece = piece[1:]
        return piece

    def decode(self, ids: list[int] | Tensor) -> str:
        """Text of ``ids``; BOS and EOS are control tokens and produce no text."""
        out = bytearray()
        prev: int | None = None
        for t in ids.tolist() if isinstance(ids, Tensor) else ids:
            t = int(t)
            if t not in (BOS_ID, EOS_ID):
                out += self.decode_piece(prev, t)
            prev = t
        return out.decode("utf-8", errors="replace")
