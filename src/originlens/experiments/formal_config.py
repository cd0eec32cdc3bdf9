"""The formal-features experiment's configuration (:mod:`.formal`): its scales (one commented table),
the regimes, and the deviations from the paper.

At the bottom of the experiment: :mod:`.formal` and :mod:`.formal_stages` import from here, never the
reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .config_checks import check_overrides, check_scale, check_seeds

EXPERIMENT = "formal"
REGIMES = ("standard", "myopic")
ALPHA = 0.05
PAPER_SIGMA = {"formal": "1.63 ± 0.03", "other": "1.23 ± 0.02"}
# setting: (cpu, ci)  — what it sets
_TABLE: dict[str, tuple[Any, Any]] = {
    "stories": (None, 120),  # TinyStories lines sampled from the data root (None: all)
    "python_sources": (["stdlib"], ["stdlib"]),  # data.formal sources: stdlib and/or site-packages
    "python_max_chars": (50_000, 6000),  # longest Python file kept
    "python_ratio": (1.0, 1.0),  # Python pieces / story pieces (Whitespace pre-tokenizer pieces ≈ tokens)
    "heldout_frac": (0.1, 0.1),  # documents of each domain held out
    "vocab_size": (2048, 512),  # BPE ids
    "seq_len": (64, 32),  # T (windows of T + 1 tokens)
    "n_layer": (4, 2),
    "d_model": (128, 32),
    "n_head": (4, 2),
    "batch_size": (32, 16),
    "steps": (3000, 150),  # Adam steps per regime
    "lr": (1e-3, 3e-3),
    "eval_windows": (1000, 40),  # held-out windows per domain for the losses
    "learned_margin": (1.0, 1.0),  # nats below the untrained model that count as "learned"
    "sae_expansion": (4, 2),  # SAE latents = expansion × d
    "sae_k": (16, 4),  # TopK k
    "sae_steps": (3000, 120),
    "sae_batch": (512, 128),
    "sae_lr": (1e-3, 1e-3),
    "sae_windows": (3000, 200),  # training windows whose activations train the SAE
    "analysis_windows": (400, 20),  # held-out windows per domain for labels, Q(w) and the look-ahead maps
    "threshold": (0.8, 0.65),  # python share ≥ threshold: formal
    "min_group": (5, 2),  # fewest scored features per label for claim (a) to count
    "q_contexts": (8, 4),  # top-activating contexts per feature
    "q_max_offset": (10, 4),  # K of Q(w)
    "q_min_total_kl": (0.05, 0.0),  # Q(w)'s drop rule: features with mean Σ_d KL_d ≤ this are not scored
    "la_max_offset": (5, 3),  # look-ahead offsets 1..K
    "la_epochs": (5, 1),
    "la_lr": (1e-3, 1e-3),
    "la_batch": (256, 128),
    "la_max_positions": (20_000, 1200),
    "la_rank_frac": (0.125, 0.125),  # rank r of the subspace = la_rank_frac × d
    "steer_k": (4, 2),  # features per group (top-Q, bottom-Q, random)
    "steer_alphas": ([0.5, 1.0, 2.0], [1.0, 4.0]),  # c = α × mean residual norm at the site
    "steer_prompts": (8, 3),  # held-out story openings
    "steer_prompt_tokens": (16, 6),
    "steer_samples": (8, 2),  # samples per (prompt, feature, c)
    "steer_new_tokens": (32, 8),
    "n_boot": (2000, 200),  # bootstrap resamples over features
    "n_perm": (2000, 200),  # label / rank permutations
}
SCALES: dict[str, dict[str, Any]] = {sc: {k: v[i] for k, v in _TABLE.items()} for i, sc in enumerate(("cpu", "ci"))}
SCALE_NOTES = {
    "cpu": "4 × 128 GPT on ≈ 3 M tokens of stories + Python; both regimes of a seed in ≈ 20 min on 2 CPU cores "
    "(measured: ≈ 8 min training per regime, ≈ 2.5 min SAEs, Q(w), steering and look-ahead)",
    "ci": "a plumbing check in seconds; not a result",
}


@dataclass
class FormalConfig:
    """Seeds × the scale's settings; ``overrides`` replace scale fields (each recorded as a deviation).
    ``split_seed`` fixes the document sample and the held-out split (shared by all seeds)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    overrides: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.95
    device: str = "cpu"
    split_seed: int = 0

    def __post_init__(self) -> None:
        check_scale(self.scale, SCALES)
        check_overrides(self.overrides, SCALES["cpu"])
        check_seeds(self.seeds)
        s = self.settings
        for k in (
            "vocab_size",
            "seq_len",
            "steps",
            "eval_windows",
            "sae_steps",
            "sae_windows",
            "analysis_windows",
            "steer_k",
            "steer_prompts",
            "steer_samples",
            "steer_new_tokens",
            "n_boot",
            "n_perm",
            "min_group",
        ):
            if isinstance(s[k], bool) or not isinstance(s[k], int) or s[k] < 1:
                raise ConfigError(f"{k} must be a positive integer, got {s[k]!r}", f"set {k} ≥ 1")
        if not 0.5 < s["threshold"] < 1 or not 0 < s["heldout_frac"] <= 0.5:
            raise ConfigError("need 0.5 < threshold < 1 and 0 < heldout_frac ≤ 0.5", "e.g. threshold 0.8, 0.1")
        T = s["seq_len"]
        if not (s["q_max_offset"] < T and 2 <= s["la_max_offset"] < T and 1 <= s["steer_prompt_tokens"] <= T):
            raise ConfigError(
                f"need q_max_offset < seq_len, 2 ≤ la_max_offset < seq_len, 1 ≤ steer_prompt_tokens ≤ seq_len "
                f"(seq_len {T})",
                "lower the offsets or the prompt length",
            )
        if not s["steer_alphas"] or any(not a > 0 for a in s["steer_alphas"]):
            raise ConfigError(f"steer_alphas must be positive, got {s['steer_alphas']}", "e.g. 0.5,1,2")

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def name(self) -> str:
        return f"{EXPERIMENT}-{self.scale}"

    def ntp_config(self, seed: int, regime: str, corpus: Path, n_heldout: int, *, initial: bool = False) -> Any:
        from ..train.ntp import NTPConfig

        s = self.settings
        steps = 0 if initial else s["steps"]
        return NTPConfig(
            task="language",
            corpus=str(corpus),
            regime=regime,
            seed=int(seed),
            n_layer=s["n_layer"],
            d_model=s["d_model"],
            n_head=s["n_head"],
            batch_size=s["batch_size"],
            steps=steps,
            lr=s["lr"],
            eval_size=n_heldout,
            eval_every=0,
            probe_every=0,
            checkpoint_every=max(1, steps // 10) if steps else 0,
            keep_checkpoints=1,
            log_every=max(1, steps // 20) if steps else 1,
            device=self.device,
        )

    def deviations(self) -> list[str]:
        s = self.settings
        out = [
            f"model: our GPT, {s['n_layer']} layers × {s['d_model']}, trained here (paper: Gemma-2-2B)",
            f"SAE: TopK k = {s['sae_k']}, {s['sae_expansion']}·d latents at resid.{s['n_layer'] // 2}, trained here "
            "(paper: Gemma Scope)",
            f"tokenizer: BPE |V| = {s['vocab_size']} trained on our training documents, whitespace dropped "
            "(paper: Gemma's)",
            "corpus: TinyStories subset + Python standard-library sources (paper: Gemma's contexts)",
            f"labels: python share of activation mass ≥ {s['threshold']} (paper: its formal/other categorisation)",
            f"Q contexts: top {s['q_contexts']} of {2 * s['analysis_windows']} held-out windows, K = "
            f"{s['q_max_offset']}, error-preserving ablation",
            "steering: lexical code criterion on decoded text; c = α × mean residual norm",
            f"look-ahead maps: lr {s['la_lr']}, {s['la_epochs']} epochs, batch {s['la_batch']} (reference 1e-4, 10, 32)",
            f"{len(self.seeds)} training seeds (paper: one pretrained model)",
        ]
        out += [f"{k} {v} (scale {SCALES[self.scale][k]})" for k, v in self.overrides.items()]
        return out


# ----------------------------------------------------------------------------------------------------
# corpus
