"""Runnable examples of the public Python API, one per package, shown in the generated API reference
(``docs/api.md``) under each package's heading.

Each example is self-contained (it builds its own tiny data in the current directory, under ``runs/``),
runs on CPU in seconds, and ``tests/project/test_api_examples.py`` executes every one of them, so the reference
cannot show code that no longer runs.
"""

from __future__ import annotations

EXAMPLES: dict[str, str] = {
    "originlens.data": """\
import originlens as ol
store = ol.build_corpus(None, "runs/sw", vocab_size=300, seq_len=32)   # None: the storyworld corpus
print(store.tokens.shape, store.vocab_size, store.vocab[:5])           # (N, T + 1) token ids
""",
    "originlens.stats": """\
import numpy as np, originlens as ol
store = ol.build_corpus(None, "runs/sw", vocab_size=300, seq_len=32)
st = ol.corpus_statistics(np.asarray(store.tokens), store.vocab_size, vocab=store.vocab)
ol.save_statistics(st, "runs/sw-stats")
print(ol.top_associations(ol.load_statistics("runs/sw-stats"), "bigram", "the", k=5))
""",
    "originlens.theory": """\
import numpy as np, originlens as ol
store = ol.build_corpus(None, "runs/sw", vocab_size=300, seq_len=32)
st = ol.corpus_statistics(np.asarray(store.tokens), store.vocab_size, vocab=store.vocab)
w = ol.validity_window(seq_len=32, n_layers=2, eta=0.005, vocab_size=store.vocab_size)
pred = ol.predicted_weights(st, s=10, eta=0.005, n_layers=2)                # W_O, V.l, W.l, P.l
print(w.s_max, sorted(pred), pred["W_O"].shape)
""",
    "originlens.models": """\
import torch, originlens as ol
gpt = ol.GPT(ol.GPTConfig(vocab_size=50, seq_len=16, n_layer=2, d_model=32, n_head=4, regime="myopic"))
x = torch.randint(0, 50, (3, 16))
logits = gpt(x)
losses = ol.position_losses(logits, x)                                      # ω·ℓ (B, T−1); the loss is its sum
print(logits.shape, gpt.num_params(), losses.sum().item())
print([n for n, _ in gpt.named_parameters()][:4])                           # embed.0.wte.weight, …
""",
    "originlens.train": """\
import originlens as ol
cfg = ol.NTPConfig(task="cond-majority", regime="standard", d_model=32, batch_size=64, steps=50,
                   eval_size=256, eval_every=0, probe_every=0, checkpoint_every=25)
result = ol.Trainer(cfg, "runs/cm").run()                                   # resumable: resume=True
print(result.step, result.final_eval["eval_loss"], result.probe_summary)
""",
    "originlens.tasks": """\
import numpy as np, originlens as ol
task = ol.get_task("majority")
batch = task.sample(4, np.random.default_rng(0))
games = ol.generate_games(3, seed=0)                                        # synthetic Othello
print(batch.tokens.shape, games.moves.shape)
""",
    "originlens.probes": """\
import numpy as np, originlens as ol
rng = np.random.default_rng(0)
resid = rng.normal(size=(200, 1, 4, 16))                                    # (N, layers K, positions T, d)
feats = resid[:, 0, :, :2] @ np.array([[1.0, 0.0], [0.5, 1.0]])             # (N, T, F): linear in the residual
probes, metrics = ol.fit_probes(resid, feats + 0.01 * rng.normal(size=feats.shape), feature_names=["a", "b"])
print(probes.weights.shape, metrics.pearson.mean())
""",
    "originlens.attribution": """\
import torch, originlens as ol
torch.manual_seed(0)
gpt = ol.GPT(ol.GPTConfig(vocab_size=20, seq_len=12, n_layer=2, d_model=16, n_head=2))
x = torch.randint(0, 20, (4, 12))
g = ol.decompose(gpt, x, sites=[(1, 5)])[(1, 5)]                           # resid.1, position 5
full = {k: g.direct[k] + g.precached[k] + g.shared[k] for k in g.direct}    # the parts sum to the gradient
print(sorted(g.direct)[:3], sum(t.norm() for t in full.values()).item())
# influence of each pathway's SGD step on a probe feature, toward its value in a final model
final = ol.GPT(gpt.config)                                                  # stands in for the trained model
probe = ol.Probe("f", layer=1, position=5, direction=torch.randn(16))
refs = ol.reference_projections(final, x, [probe])                          # ⟨w, r(θ*)⟩ per row
steps = ol.sgd_steps(ol.decompose(gpt, x, sites=[probe.site]), lr=0.1)      # Δ_c = −lr·g_c per component
for inf in ol.influences(gpt, x, steps, [probe], refs):
    print(inf.component, round(inf.value, 6))
""",
    "originlens.sae": """\
import originlens as ol
from originlens.sae import SAEConfig
sae = ol.SAE(SAEConfig(d_in=16, d_sae=64, architecture="topk", k=4, hook_name="blocks.1.hook_resid_post"))
ol.write_sae(sae, "runs/sae")                                               # SAELens format
print(ol.read_sae("runs/sae").cfg.d_sae)
""",
    "originlens.lm": """\
import torch, originlens as ol
ol.GPT(ol.GPTConfig(vocab_size=30, seq_len=16, n_layer=2, d_model=16, n_head=2)).save("runs/gpt.safetensors")
adapter = ol.load_adapter("runs/gpt.safetensors")                           # llama2.c, HF, TL: the same API
print(adapter.n_layers, adapter.d_model, adapter.vocab_size)
ol.export_to_hf(ol.GPT.load("runs/gpt.safetensors"), "runs/gpt-hf", overwrite=True)  # GPT2LMHeadModel dir
back = ol.gpt_from_hf("runs/gpt-hf")                                        # and back: the same weights
print(back.config.n_layer, back.num_params())
""",
    "originlens.report": """\
import originlens as ol
rep = ol.Report("A tiny report")
rep.section("Numbers")
rep.table(["name", "value"], [["loss", 0.693]])
print(rep.write("runs/report"))                                             # report.html + report.md
""",
}
