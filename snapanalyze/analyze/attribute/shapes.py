"""Size arithmetic the shape heuristics test: attention scores (k·L²·b), logits (tokens × vocabulary × b: of a known
vocabulary a live weight proves, or of any vocabulary where the vocabulary matrix and the tokens' embedding lookup
fix it together) and the vocabulary a live embedding weight proves. Pure functions of sizes; the signals stage
decides where they may apply (`signals`), and every result they give is flagged inferred there.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet

import numpy as np

# Vocabulary sizes of common LLM families, for the tokens × vocab logits heuristic.
KNOWN_VOCABS = (32000, 32001, 32064, 32256, 32768, 49152, 50257, 50272, 50280, 51200, 64000, 65024, 65536,
                92544, 100352, 102400, 128000, 128256, 129280, 151646, 151936, 152064, 163840, 200064,
                201088, 256000, 262144, 262208)



def shape_scores(size: int) -> tuple[int, int, int] | None:
    """(k, L, bytes per element) with size = k·L²·b, L ≥ 128 a multiple of 64, 8 ≤ k ≤ 4096 — or None.

    k stands for batch × heads; several (k, L) usually fit, so the largest L is only an example."""
    for b in (4, 2):
        if size % b:
            continue
        x = size // b
        for L in range(int(np.sqrt(x / 8)) // 64 * 64, 127, -64):
            if x % (L * L) == 0 and 8 <= x // (L * L) <= 4096:
                return x // (L * L), L, b
    return None


def shape_logits(size: int, hints: frozenset[tuple[int, int]], allocated: Callable[[], AbstractSet[int]]
                  ) -> tuple[int, int, int] | None:
    """(tokens, vocab, bytes per element) for a ≥ 16 MiB size = T·V·b — or None.

    V must be the vocabulary of a live embedding or lm_head weight (`vocab_hints`: V with the hidden sizes
    its norm weights prove), and the trace must also have allocated those T tokens' hidden states, a block
    of T × hidden × 2 or 4 bytes (`allocated()`: the sizes the trace allocated, but those of live weights):
    sizes factor over many vocabularies, and an activation T'·F·b (an MLP's 1000 × 5632 × 4 B is 176 ×
    32000 × 4 B) fits a vocabulary by coincidence, where nothing made 176 tokens' hidden states. Where both
    element widths fit, 4 bytes wins (logits are upcast). Powers of two are refused as too ambiguous."""
    if size < (16 << 20) or size & (size - 1) == 0:
        return None
    found = [(tokens, v, b) for v, hidden in hints for b in (4, 2)
             if size % (v * b) == 0 and (tokens := size // (v * b)) >= 16
             and any(tokens * hidden * h in allocated() for h in (2, 4))]
    return max(found, key=lambda f: (f[1], f[2])) if found else None


def vocab_hints(sizes: np.ndarray) -> frozenset[tuple[int, int]]:
    """The vocabulary of the live embedding / lm_head weight and its hidden sizes, (V, hidden) pairs, if the
    weight sizes prove one V.

    The largest weight block of a language model is its vocabulary matrix, V × hidden × b bytes (b = 2 or 4,
    hidden a multiple of 256), and its norm weights (and biases) are blocks of exactly hidden × b bytes. A
    known V counts only when such a block corroborates its hidden size: one product fits many vocabularies
    (Llama-2's 32000 × 4096 × 2 B is also 64000 × 2048, 128000 × 1024 and 256000 × 512 × 2 B), and a model
    whose vocabulary is not its largest weight (a small vocabulary under wide MLPs) fits one by coincidence.
    Empty unless exactly one V is corroborated (with each hidden size that fits it: 32000 × 4096 × 2 B and
    32000 × 2048 × 4 B are one product). Power-of-two vocabularies are left out (every power-of-two weight
    would fit them)."""
    if len(sizes) == 0:
        return frozenset()
    largest = int(np.max(sizes))
    present = set(sizes.tolist())
    fits = {(v, hidden) for v in KNOWN_VOCABS if v & (v - 1) for b in (2, 4)
            if largest % (v * b) == 0 and 512 <= (hidden := largest // (v * b)) <= 32768 and hidden % 256 == 0
            and hidden * b in present}
    return frozenset(fits) if len({v for v, _ in fits}) == 1 else frozenset()



def lookup_logits(size: int, weights: AbstractSet[int], lookups: AbstractSet[int]) -> tuple[int, int, int] | None:
    """(tokens, vocab, bytes per element) for a ≥ 16 MiB size = T·V·b' where a live weight is the vocabulary
    matrix V·H·b and an embedding lookup made T·H·b (the tokens' hidden states): the three sizes fix H, then T
    and V, together — H² = E·W·b' / (L·b²) must be a whole number that divides both — which a size fits by
    coincidence far less often than one product of a known vocabulary. Whatever the vocabulary (a model's own
    tokenizer is in no list). H ≥ 64, V ≥ 1,000 and T ≥ 1."""
    if size < (16 << 20):
        return None
    for lookup in lookups:
        for weight in weights:
            for b in (2, 4):
                for b_out in (4, 2):
                    square, rest = divmod(lookup * weight * b_out, size * b * b)
                    if rest or square <= 0:
                        continue
                    hidden = int(round(square ** 0.5))
                    if hidden * hidden != square or hidden < 64 or (lookup % (hidden * b)) \
                            or (weight % (hidden * b)):
                        continue
                    tokens, vocab = lookup // (hidden * b), weight // (hidden * b)
                    if vocab >= 1000 and tokens * vocab * b_out == size:
                        return tokens, vocab, b_out
    return None
