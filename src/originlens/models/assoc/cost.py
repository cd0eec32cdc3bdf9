"""The cost model that picks an implementation of the one-hot attention model (:func:`path_cost`): multiply-adds
of each implementation per step, batched and gathered work weighted by measured CPU penalties.  Part of
:mod:`originlens.models.assoc`."""

from __future__ import annotations

BMM_PENALTY = 2.0  # batched T-sized products run ~2× slower per multiply-add than large GEMMs
ELEMENT_COST = 20.0  # one gathered/scattered element costs about as much as 20 GEMM multiply-adds


def path_cost(batch: int, seq_len: int, vocab: int, n_layers: int) -> dict[str, float]:
    """Cost estimates of one forward + backward in GEMM multiply-add equivalents (calibrated on CPU:
    batched T-sized products weighted by ``BMM_PENALTY``, memory-bound gathers/scatters by
    ``ELEMENT_COST`` per element); used by ``impl="auto"``.

    ``paths``: 3 × (number of |V|³ products) × |V|³ + 3·m·B·T²·|V| for the logits path (m = 2^L − 1) +
    the attention mixing + gathers/scatters of K entries and Z rows.
    """
    B, T, V, L = batch, seq_len, vocab, n_layers
    m = 2**L - 1
    n_prod = m  # V_S W_O
    mix = 0.0
    elems = 2 * m * B * T * V  # Z rows gathered, their gradients scattered
    for l in range(1, L + 1):
        k = 2 ** (l - 1)
        n_prod += (k - 1) + k * (k - 1)  # V_S W and V_S W V_S'ᵀ
        mix += 3 * (k * B * T * T * k * T + B * T * T * k * T)  # Y = Σ A_S G[S], s = Y Acatᵀ, ×3 with backward
        elems += 2 * B * T * T * k * k  # K entries gathered and scattered
    paths = 3 * n_prod * V**3 + BMM_PENALTY * (3 * m * B * T * T * V + mix) / 2 + ELEMENT_COST * elems
    gather = (
        (2 * L - 1) * 3 * B * T * V * V + BMM_PENALTY * (2 * L - 1) * 3 * B * T * T * V + ELEMENT_COST * 4 * B * T * V
    )
    dense = (2 * L + 1) * 3 * B * T * V * V + BMM_PENALTY * 2 * L * 3 * B * T * T * V + ELEMENT_COST * B * T * V
    return {"paths": float(paths), "gather": float(gather), "dense": float(dense)}
