"""The paper's downstream suite through lm-evaluation-harness (SAMOE §11), on a tiny random
SA-MoE wrap of a Hub Llama model (no download). Without the harness: the scoring core against
a naive per-request forward (sum of log-softmax over the continuation, greedy flag), the left
truncation at max_len, batching and order invariance, quality's task and macro rows from a
run's harness file (samoe_quality --harness), the environment's pins. With the harness
(``python requirements/lm_eval_env.py``, then this file under ``.lm-eval/bin/python -m
pytest``): the adapter's requests as the harness encodes them, ``simple_evaluate`` on a local
six-example multiple-choice task against the argmax of naive log-likelihoods, and the
offline stop naming the dataset."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from packaging.utils import canonicalize_name

from headgeom.hashing import sha256_file
from headgeom.samoe import harness, results
from headgeom.samoe.checkpoint import save_moe
from headgeom.samoe.config import MoEConfig
from headgeom.samoe.hub import HubSource, dense_state
from headgeom.samoe.manifest import run_metadata, write_run_manifest
from headgeom.samoe.upcycle import upcycle
from tests.helpers.samoe_hub import N_VOCAB, dense_lm, randomise_moe

ROOT = Path(__file__).resolve().parents[3]
MOE = MoEConfig(n_experts=6, top_k=2, state_dim=8, router_x_init="state_block")
HAS_HARNESS = importlib.util.find_spec("lm_eval") is not None
needs_harness = pytest.mark.skipif(
    not HAS_HARNESS,
    reason="lm-evaluation-harness is not installed in this environment (it has its own): "
    f"`{harness.ENV_COMMAND}`, then "
    f"`.lm-eval/bin/python -m pytest {Path(__file__).relative_to(ROOT)}`",
)


@pytest.fixture(scope="module", params=["latest", "persistent"])
def model(request):
    lm = dense_lm("llama")
    source = HubSource.of("tiny/llama", "0" * 40, lm.config)
    wrap = upcycle(dense_state(lm), source, MOE, request.param, 42).eval()
    return randomise_moe(wrap, seed=5)


def naive(model, context, continuation):
    """log p(continuation | context) and the greedy flag from one unbatched float64 forward."""
    ids = torch.tensor([[*context, *continuation]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1])[0].double(), -1)
    pos = torch.arange(len(context) - 1, ids.shape[1] - 1)
    cont = torch.tensor(continuation)
    return logp[pos, cont].sum().item(), bool((logp[pos].argmax(-1) == cont).all())


def random_requests(n, seed, max_ctx=12, max_cont=4):
    rng = random.Random(seed)
    return [([rng.randrange(N_VOCAB) for _ in range(rng.randint(1, max_ctx))],
             [rng.randrange(N_VOCAB) for _ in range(rng.randint(1, max_cont))])
            for _ in range(n)]  # fmt: skip


def test_loglikelihood_is_the_naive_sum_over_the_continuation(model):
    requests = random_requests(9, seed=1)
    got = harness.score_requests(model, requests, max_len=64, batch_size=4)
    for (ctx, cont), (ll, greedy) in zip(requests, got, strict=True):
        want, want_greedy = naive(model, ctx, cont)
        assert ll == pytest.approx(want, abs=1e-4)
        assert greedy == want_greedy


def test_the_greedy_flag_is_true_exactly_for_the_greedy_continuation(model):
    ctx, cont = [3, 17, 8], []
    with torch.no_grad():
        for _ in range(3):  # greedy decoding by hand
            cont.append(int(model(torch.tensor([ctx + cont]))[0, -1].argmax()))
    other = [*cont[:-1], (cont[-1] + 1) % N_VOCAB]
    (ll, greedy), (ll_other, greedy_other) = harness.score_requests(
        model, [(ctx, cont), (ctx, other)], max_len=64
    )
    assert greedy and not greedy_other and ll > ll_other


def test_a_long_request_loses_context_from_the_left_only(model):
    rng = random.Random(2)
    ctx, cont = [rng.randrange(N_VOCAB) for _ in range(30)], [5, 9, 11]
    max_len = 16
    ((ll, greedy),) = harness.score_requests(model, [(ctx, cont)], max_len=max_len)
    # the model reads the last max_len + 1 tokens less the last: 14 context tokens kept
    kept = [*ctx, *cont][-(max_len + 1) :]
    want, want_greedy = naive(model, kept[: -len(cont)], cont)
    assert ll == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    assert harness.model_input(ctx, cont, max_len) == kept[:-1]
    # a continuation of max_len tokens keeps it whole and one context token
    long = [rng.randrange(N_VOCAB) for _ in range(max_len)]
    assert harness.model_input(ctx, long, max_len) == [ctx[-1], *long[:-1]]
    with pytest.raises(ValueError, match="does not fit max_len"):
        harness.model_input(ctx, [*long, 1], max_len)


def test_batching_and_request_order_change_nothing(model):
    requests = random_requests(11, seed=3)
    one = harness.score_requests(model, requests, max_len=64, batch_size=1)
    order = list(range(len(requests)))
    random.Random(4).shuffle(order)
    for batch_size in (3, 64):
        got = harness.score_requests(model, [requests[i] for i in order], 64, batch_size)
        back = [None] * len(order)
        for k, i in enumerate(order):
            back[i] = got[k]
        np.testing.assert_allclose([b[0] for b in back], [o[0] for o in one], atol=1e-5)
        assert [b[1] for b in back] == [o[1] for o in one]


def test_quality_rows_take_each_tasks_primary_and_their_mean():
    rows = [("hellaswag", "acc", 0.30, 100, False), ("hellaswag", "acc_norm", 0.35, 100, True),
            ("arc_easy", "acc", 0.50, 40, False), ("arc_easy", "acc_norm", 0.45, 40, True),
            ("piqa", "acc", 0.60, 20, False), ("piqa", "acc_norm", 0.62, 20, True),
            ("winogrande", "acc", 0.51, 10, True)]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["task", "metric", "value", "n", "primary"])
    got = pd.DataFrame(harness.quality_rows(frame))
    primary = got[got["metric"] == "primary"].set_index("subset")["value"]
    assert primary.to_dict() == pytest.approx(
        {
            "hellaswag": 0.35,
            "arc_easy": 0.45,
            "piqa": 0.62,
            "winogrande": 0.51,
            "macro": (0.35 + 0.45 + 0.62 + 0.51) / 4,
        }
    )
    macro = got.iloc[-1]
    assert (macro["subset"], macro["n"]) == ("macro", 170)
    # winogrande reports acc only; the others acc and acc_norm
    assert got[got["subset"] == "winogrande"]["metric"].tolist() == ["acc", "primary"]
    assert harness.PRIMARY == {"hellaswag": "acc_norm", "arc_easy": "acc_norm",
                               "piqa": "acc_norm", "winogrande": "acc"}  # fmt: skip


def test_table6_describes_each_suite_by_its_own_protocol():
    pytest.importorskip("matplotlib", reason="headgeom.samoe.paper draws figures: not installed in "
                        "the harness's environment (the workspace's own runs this)")  # fmt: skip
    from types import SimpleNamespace

    from headgeom.samoe.paper import table6
    from headgeom.samoe.study import SAMoEStudy

    paper = SAMoEStudy.from_config(
        yaml.safe_load((ROOT / "config" / "samoe-paper.yaml").read_text())
    )
    frame = table6(SimpleNamespace(config=paper.config)).frame.set_index("task")
    assert frame["n"].to_dict() == {"hellaswag": 10_042, "arc_easy": 2_376, "piqa": 1_838,
                                    "winogrande": 1_267}  # fmt: skip
    assert frame["metric"].to_dict() == harness.PRIMARY
    assert frame.loc["winogrande", "scoring"].startswith("partial scoring")
    toy = SAMoEStudy.from_config(yaml.safe_load((ROOT / "config" / "samoe.yaml").read_text()))
    frame = table6(SimpleNamespace(config=toy.config)).frame.set_index("task")
    assert frame["metric"].to_dict() == {"sva": "acc", "quote": "acc", "plural": "acc",
                                         "arith": "acc_norm"}  # fmt: skip
    assert frame.loc["arith", "n"] == 512 and frame.loc["sva", "choices"] == 2


def _hub_run(tmp_path, model):
    """A Hub run on disk as samoe_quality reads it: checkpoint, run manifest, pools, corpus
    manifest."""
    ckpt = tmp_path / "model.safetensors"
    save_moe(ckpt, model, np.arange(N_VOCAB))
    manifest = {"checkpoint_file_sha256": sha256_file(ckpt)}
    write_run_manifest(tmp_path / "manifest.json", manifest)
    g = np.random.default_rng(0)
    pools = pd.DataFrame([{"role": "final", "domain": d, "seq_id": f"{d}-{i:04d}",
                           "intervention": i == 0, "tokens": g.integers(0, N_VOCAB, 16)}
                          for d in ("prose", "code", "math") for i in range(2)])  # fmt: skip
    results.POOLS.write(tmp_path / "pools.parquet", pools)
    (tmp_path / "corpus.json").write_text(json.dumps(
        {"files": {"pools": sha256_file(tmp_path / "pools.parquet")}}))  # fmt: skip
    return manifest


def test_samoe_quality_reads_a_hub_runs_harness_file(tmp_path, model):
    from headgeom.samoe.stages import quality as samoe_quality

    manifest = _hub_run(tmp_path, model)
    run = {"family": "smollm2", "variant": model.variant, "seed": 42}
    rows = [{"task": t, "metric": m, "value": v, "stderr": 0.01, "n": 7, "primary": p,
             "task_version": "1.0", "task_config_sha256": "0" * 64,
             "harness_version": "0.4.13", "harness_commit": None}
            for t, m, v, p in [("piqa", "acc", 0.6, False), ("piqa", "acc_norm", 0.7, True),
                               ("winogrande", "acc", 0.5, True)]]  # fmt: skip
    frame = pd.DataFrame(rows).assign(**run)
    results.HARNESS.write(tmp_path / "harness.parquet", frame, run_metadata(run, manifest))
    argv = [
        "--run-json",
        json.dumps(run),
        "--device",
        "auto",
        "--checkpoint",
        str(tmp_path / "model.safetensors"),
        "--manifest",
        str(tmp_path / "manifest.json"),
        "--pools",
        str(tmp_path / "pools.parquet"),
        "--corpus-manifest",
        str(tmp_path / "corpus.json"),
        "--harness",
        str(tmp_path / "harness.parquet"),
        "--out",
        str(tmp_path / "q.parquet"),
    ]
    assert samoe_quality.main(argv) == 0
    q = pd.read_parquet(tmp_path / "q.parquet")
    acc = q[q["metric"] != "ppl"]
    assert acc["subset"].tolist() == ["piqa"] * 3 + ["winogrande"] * 2 + ["macro"]
    assert acc.iloc[-1]["value"] == pytest.approx(0.6) and acc.iloc[-1]["n"] == 14
    assert q[q["metric"] == "ppl"]["subset"].tolist() == ["all", "prose", "code", "math"]
    # a harness file of another checkpoint is refused
    other = dict(manifest, checkpoint_file_sha256="f" * 64)
    results.HARNESS.write(tmp_path / "harness.parquet", frame, run_metadata(run, other))
    with pytest.raises(ValueError, match="not this run's"):
        samoe_quality.main(argv)


def test_the_environment_pins_the_spec_commit_and_the_lock_versions():
    from tests.unit.test_dependencies import LOCK

    env = yaml.safe_load((ROOT / "envs" / "lm-eval.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    paper = yaml.safe_load((ROOT / "config" / "samoe-paper.yaml").read_text())
    commit = paper["downstream"]["harness_commit"]
    assert pip[0] == f"lm_eval @ git+https://github.com/EleutherAI/lm-evaluation-harness@{commit}"
    pins = dict(p.split("==") for p in pip[1:])
    assert {n: v for n, v in pins.items() if str(LOCK[canonicalize_name(n)]) != v} == {}
    assert "torch" in pins and "transformers" in pins


@pytest.mark.skipif(HAS_HARNESS, reason="the harness is installed here")
def test_without_the_harness_the_adapter_names_its_environment():
    with pytest.raises(ImportError, match="lm_eval_env.py"):
        harness.lm_class()


# ------------------------------------------------------------------ with the harness


def word_tokenizer(tmp_path, words):
    """A fast word-level tokenizer (whitespace split) of ``words`` with [EOS] as EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[EOS]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    assert len(vocab) <= N_VOCAB
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="[EOS]", unk_token="[UNK]")
    tok.save_pretrained(tmp_path / "tok")
    return PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")


WORDS = "the cat dog sat ran on mat rug a big red blue fox jumped over fence Question: Answer:"


def mc_task(tmp_path, name="headgeom_mc", dataset_path="json"):
    """A local six-example multiple-choice task (lm-eval YAML reading a JSONL file)."""
    rng = random.Random(7)
    words = WORDS.split()[:-2]
    docs = []
    for i in range(6):
        query = "Question: " + " ".join(rng.choices(words, k=rng.randint(2, 6))) + "\nAnswer:"
        k = 2 + i % 3
        choices = [" ".join(rng.choices(words, k=rng.randint(1, 3))) for _ in range(k)]
        docs.append({"query": query, "choices": choices, "label": rng.randrange(k)})
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    task_dir = tmp_path / "tasks"
    task_dir.mkdir(exist_ok=True)
    kwargs = {"data_files": {"test": str(data)}, "cache_dir": str(tmp_path / "hf-cache")}
    cfg = {"task": name, "dataset_path": dataset_path, "dataset_kwargs": kwargs,
           "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "query",
           "doc_to_target": "label", "doc_to_choice": "choices",
           "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                           {"metric": "acc_norm", "aggregation": "mean",
                            "higher_is_better": True}],
           "metadata": {"version": 1.0}}  # fmt: skip
    (task_dir / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return task_dir, docs


def split(tok, context, continuation):
    """The harness's causal encoding of a pair: the whole text encoded, the context's
    tokens split off (trailing context spaces moved to the continuation)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = tok.encode(context + continuation), tok.encode(context)
    return ctx, whole[len(ctx) :]


@needs_harness
def test_the_adapter_scores_requests_as_the_harness_encodes_them(tmp_path, model):
    from lm_eval.api.instance import Instance

    tok = word_tokenizer(tmp_path, WORDS.split())
    lm = harness.lm_class()(model, tok, max_len=64, batch_size=2)
    pairs = [("the cat sat", " on the mat"), ("a big red fox ", "jumped"),
             ("Question: the dog\nAnswer:", " ran"), ("", "the blue fence")]  # fmt: skip
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i)
            for i, p in enumerate(pairs)]  # fmt: skip
    got = lm.loglikelihood(reqs)
    for (ctx, cont), (ll, greedy) in zip(pairs[:3], got[:3], strict=True):
        want, want_greedy = naive(model, *split(tok, ctx, cont))
        assert ll == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    # an empty context conditions on the prefix token (no BOS here: EOS)
    assert got[3][0] == pytest.approx(
        naive(model, [tok.eos_token_id], tok.encode("the blue fence"))[0], abs=1e-4
    )
    with pytest.raises(NotImplementedError, match="no generation"):
        lm.generate_until([])


@needs_harness
def test_simple_evaluate_gives_the_argmax_of_naive_loglikelihoods(tmp_path, model):
    tok = word_tokenizer(tmp_path, WORDS.split())
    task_dir, docs = mc_task(tmp_path)
    manager = harness.task_manager(task_dir, include_defaults=False)
    tasks = harness.load_tasks(["headgeom_mc"], manager)
    lm = harness.lm_class()(model, tok, max_len=64, batch_size=4)
    out = harness.evaluate(lm, tasks, manager)
    acc, acc_norm = [], []
    for d in docs:  # the harness's requests: (query, " " + choice), zero-shot
        lls = np.array([naive(model, *split(tok, d["query"], " " + c))[0] for c in d["choices"]])
        norm = lls / np.array([len(c) for c in d["choices"]])
        acc.append(float(np.argmax(lls) == d["label"]))
        acc_norm.append(float(np.argmax(norm) == d["label"]))
    found = {"harness_version": "x", "harness_commit": None}
    rows = {r["metric"]: r for r in harness.result_frame(out, ["headgeom_mc"], found)}
    assert 0 < np.mean(acc) < 1 or 0 < np.mean(acc_norm) < 1  # not a trivial suite
    assert rows["acc"]["value"] == pytest.approx(np.mean(acc))
    assert rows["acc_norm"]["value"] == pytest.approx(np.mean(acc_norm))
    assert rows["acc"]["n"] == 6 and len(rows["acc"]["task_config_sha256"]) == 64


@needs_harness
def test_offline_the_stage_stops_naming_the_dataset_and_writes_nothing(tmp_path, monkeypatch):
    from headgeom.samoe.stages import harness as samoe_harness

    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    task_dir, _ = mc_task(tmp_path, name="headgeom_hub_mc", dataset_path="headgeom-tests/nowhere")
    index = harness.task_manager
    monkeypatch.setattr(harness, "task_manager",  # seconds saved: the harness's own not indexed
                        lambda task_dir: index(task_dir, include_defaults=False))  # fmt: skip
    cfg = {"tasks": ["headgeom_hub_mc"], "max_len": 64, "task_dir": str(task_dir)}
    out = tmp_path / "out" / "harness.parquet"
    argv = ["--run-json", json.dumps({"family": "smollm2", "variant": "latest", "seed": 42}),
            "--device", "auto", "--downstream-json", json.dumps(cfg),
            "--checkpoint", str(tmp_path / "none"),
            "--manifest", str(tmp_path / "none.json"), "--corpus-manifest",
            str(tmp_path / "none.json"), "--out", str(out), "--allow-other-harness"]  # fmt: skip
    with pytest.raises(SystemExit, match=r"headgeom-tests/nowhere.*HF_DATASETS_OFFLINE.*task_dir"):
        samoe_harness.main(argv)
    assert not out.parent.exists()


@needs_harness
def test_the_stage_writes_a_runs_suite_that_quality_reads(tmp_path, model, monkeypatch):
    from headgeom.samoe.hub_corpus import tokenizer_sha256
    from headgeom.samoe.stages import harness as samoe_harness
    from headgeom.samoe.stages import quality as samoe_quality

    manifest = _hub_run(tmp_path, model)
    tok = word_tokenizer(tmp_path, WORDS.split())
    record = {"files": json.loads((tmp_path / "corpus.json").read_text())["files"],
              "tokenizer": {"repo_id": str(tmp_path / "tok"), "revision": "a" * 40,
                            "tokenizer_json_sha256": tokenizer_sha256(tok)}}  # fmt: skip
    (tmp_path / "corpus.json").write_text(json.dumps(record))
    task_dir, docs = mc_task(tmp_path)
    index = harness.task_manager
    monkeypatch.setattr(harness, "task_manager",  # seconds saved: the harness's own not indexed
                        lambda task_dir: index(task_dir, include_defaults=False))  # fmt: skip
    run = {"family": "smollm2", "variant": model.variant, "seed": 42}
    cfg = {"tasks": ["headgeom_mc"], "max_len": 64, "batch_size": 3, "task_dir": str(task_dir),
           "harness_commit": "b" * 40}  # fmt: skip
    files = {k: str(tmp_path / v) for k, v in (("checkpoint", "model.safetensors"),
             ("manifest", "manifest.json"), ("corpus-manifest", "corpus.json"))}  # fmt: skip
    argv = ["--run-json", json.dumps(run), "--device", "auto", "--downstream-json", json.dumps(cfg),
            *(x for k, v in files.items() for x in (f"--{k}", v)),
            "--out", str(tmp_path / "harness.parquet")]  # fmt: skip
    # the pinned commit is not what the registry installed: refused unless allowed
    with pytest.raises(SystemExit, match="pins lm-evaluation-harness bbbb"):
        samoe_harness.main(argv)
    assert samoe_harness.main([*argv, "--allow-other-harness"]) == 0
    suite = harness.read_run_suite(tmp_path / "harness.parquet", manifest)
    assert suite["metric"].tolist() == ["acc", "acc_norm"] and (suite["n"] == 6).all()
    assert suite["harness_version"].iloc[0] == harness.harness_provenance()["harness_version"]
    # the stage's numbers are the ones simple_evaluate gives on the same model
    manager = index(task_dir, include_defaults=False)
    direct = harness.evaluate(harness.lm_class()(model, tok, 64),
                              harness.load_tasks(["headgeom_mc"], manager), manager)  # fmt: skip
    assert suite["value"].tolist() == pytest.approx(
        [direct["results"]["headgeom_mc"][f"{m},none"] for m in ("acc", "acc_norm")]
    )
    argv = [
        "--run-json",
        json.dumps(run),
        "--device",
        "auto",
        "--pools",
        str(tmp_path / "pools.parquet"),
        *(x for k, v in files.items() for x in (f"--{k}", v)),
        "--harness",
        str(tmp_path / "harness.parquet"),
        "--out",
        str(tmp_path / "q.parquet"),
    ]
    assert samoe_quality.main(argv) == 0
    q = pd.read_parquet(tmp_path / "q.parquet").set_index(["metric", "subset"])["value"]
    assert q[("primary", "macro")] == pytest.approx(suite[suite["primary"]]["value"].iloc[0])


class _Logits(torch.nn.Module):
    """A Hugging Face causal LM as the adapter calls models: ids -> logits."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, ids):
        return self.hf(input_ids=ids, use_cache=False).logits


@needs_harness
def test_the_adapter_answers_as_the_harness_own_hf_model(tmp_path):
    """The reference: lm_eval's HFLM on the same Hub model and tokenizer, with a max_length
    short enough that contexts are cut, a trailing-space context, an empty context, a
    one-token and a long continuation, and rolling log-likelihoods over several windows."""
    pytest.importorskip("accelerate", reason="HFLM imports accelerate (lm_eval_env.py adds it)")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    tok = word_tokenizer(tmp_path, WORDS.split())
    hf = dense_lm("llama")
    hf.save_pretrained(tmp_path / "hf")
    ref = HFLM(pretrained=str(tmp_path / "hf"), tokenizer=str(tmp_path / "tok"), max_length=12,
               batch_size=3, device="cpu", dtype="float32")  # fmt: skip
    ours = harness.lm_class()(_Logits(hf), tok, max_len=12, batch_size=2)
    words = WORDS.split()[:-2]
    rng = random.Random(11)
    pairs = [
        (
            " ".join(rng.choices(words, k=rng.randint(1, 20))),
            " " + " ".join(rng.choices(words, k=rng.randint(1, 5))),
        )
        for _ in range(10)
    ]
    pairs += [("a big red fox ", "jumped over"), ("", "the blue fence"),
              ("the cat", " " + " ".join(rng.choices(words, k=12)))]  # fmt: skip
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i)
            for i, p in enumerate(pairs)]  # fmt: skip
    want, got = ref.loglikelihood(reqs), ours.loglikelihood(reqs)
    np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], rtol=1e-5, atol=1e-4)
    assert [g[1] for g in got] == [w[1] for w in want]
    text = " ".join(rng.choices(words, k=40))
    rolling = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)]
    assert ours.loglikelihood_rolling(rolling)[0] == pytest.approx(
        ref.loglikelihood_rolling(rolling)[0], rel=1e-5
    )
