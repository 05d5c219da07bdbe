"""The paper's downstream suite through lm-evaluation-harness (SAMOE §11): HellaSwag, ARC-Easy,
PIQA and WinoGrande, zero-shot, no system prompt, no chat template, no generation; the
requests are the harness's own (its task configs build them at the pinned commit), scored by
an SA-MoE checkpoint in its family's tokenizer.

Two parts:

* :func:`score_requests`, the scoring core, plain torch (no harness needed): for each request
  (context ids, continuation ids) the summed log p(continuation | context) and whether the
  continuation is the greedy one, exactly as the harness's Hugging Face model computes them
  (``lm_eval.models.huggingface.HFLM._loglikelihood_tokens``): the model reads
  ``(context + continuation)[-(max_len + 1):][:-1]`` (too long: the context is cut from the
  left, the whole continuation and at least one context token kept), requests are batched
  longest first and right-padded (a causal model's scores never see the padding after them),
  and the answers come back in request order.
* :func:`lm_class`, the ``lm_eval.api.model.TemplateLM`` subclass over that core (the
  harness's own request encoding: trailing context spaces moved to the continuation, the
  pair encoded whole and split; an empty context conditions on the prefix token), built on
  first use so that this module imports without the harness. ``generate_until`` refuses.

:func:`evaluate` runs ``lm_eval.simple_evaluate`` on it; :func:`result_frame` turns the
harness's results into the rows of ``headgeom.samoe.results.HARNESS`` and
:func:`quality_rows` those into quality's task and macro rows (the toy suite's
``headgeom.samoe.downstream`` is untouched).

The harness lives in its own environment (``envs/lm-eval.yaml`` for the workflow's rule,
``python requirements/lm_eval_env.py`` for a local one): the workspace's lock never sees it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

import torch
from torch.nn import functional as F

from headgeom.io import metadata_text, read_parquet_metadata, read_table
from headgeom.samoe.hub_corpus import HubCorpusError, load_hf_tokenizer, tokenizer_sha256
from headgeom.samoe.results import HARNESS

#: The metric each paper task reports (SAMOE §11): acc_norm for the first three, acc for
#: WinoGrande (partial scoring; the harness reports no acc_norm for it); macro = their mean.
PRIMARY = {"hellaswag": "acc_norm", "arc_easy": "acc_norm", "piqa": "acc_norm",
           "winogrande": "acc"}  # fmt: skip
#: [CHOICE] SAMOE §11: the harness-default evaluation split of each paper task, its examples,
#: choices per example (ARC-Easy: mostly 4) and how a choice is scored (paper Table 6).
SPLITS = {
    "hellaswag": ("validation", 10_042, 4, "summed log-likelihood of each ending, divided by "
                  "its character length"),
    "arc_easy": ("test", 2_376, 4, "summed log-likelihood of each answer, divided by its "
                 "character length"),
    "piqa": ("validation", 1_838, 2, "summed log-likelihood of each solution, divided by its "
             "character length"),
    "winogrande": ("validation (xl)", 1_267, 2, "partial scoring: each option inserted in the "
                   "prefix, the log-likelihood of the shared suffix"),
}  # fmt: skip
#: The metrics read from the harness's results, in this order, where a task reports them.
METRICS = ("acc", "acc_norm")
#: How to make the local harness environment (the tests that need it say so when it is absent).
ENV_COMMAND = "python requirements/lm_eval_env.py"
#: What to set when a task's dataset cannot be read.
OFFLINE_HINT = (
    "Either run once with network so that the datasets cache (HF_HOME or HF_DATASETS_CACHE) "
    "holds it, then set HF_DATASETS_OFFLINE=1 (and HF_HUB_OFFLINE=1) to use that cache "
    "offline; or set downstream.task_dir to a folder of lm-eval task YAMLs of the same names "
    "that read local files (dataset_path: json, dataset_kwargs: {data_files: ...})"
)


class HarnessError(RuntimeError):
    """The suite cannot run as configured (raised before anything is written)."""


Request = tuple[Sequence[int], Sequence[int]]  # (context ids, continuation ids)


def model_input(context: Sequence[int], continuation: Sequence[int], max_len: int) -> list[int]:
    """The ids the model reads for one request: ``(context + continuation)[-(max_len + 1):]``
    without its last token, so that every continuation token is predicted; a too-long
    request loses context from the left (SAMOE §11, the harness's HF model)."""
    if len(context) < 1 or len(continuation) < 1:
        raise ValueError(f"a request needs a context and a continuation (got {len(context)} "
                         f"and {len(continuation)} tokens)")  # fmt: skip
    if len(continuation) > max_len:
        raise ValueError(f"a continuation of {len(continuation)} tokens does not fit max_len "
                         f"{max_len}")  # fmt: skip
    return [*context, *continuation][-(max_len + 1) :][:-1]


@torch.no_grad()
def score_requests(
    model: Callable[[torch.Tensor], torch.Tensor],
    requests: Sequence[Request],
    max_len: int,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) of every request, in request order. ``model`` maps ids
    (B, T) to logits (B, T, V); log-softmax in float32 over the scored positions only, the
    sum over the continuation in float64."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1 (got {batch_size})")
    full = [[*c, *k] for c, k in requests]
    # longest first (the harness's order: the first batch is the widest), ties by the ids
    order = sorted(range(len(requests)), key=lambda i: (-len(full[i]), tuple(full[i])))
    out: list[tuple[float, bool] | None] = [None] * len(requests)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        inputs = [model_input(*requests[i], max_len) for i in chunk]
        width = max(len(x) for x in inputs)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, x in enumerate(inputs):  # right padding: causal scores never see it
            ids[row, : len(x)] = torch.as_tensor(x, dtype=torch.long)
        logits = model(ids.to(device))  # (B, width, V)
        for row, i in enumerate(chunk):
            cont = torch.as_tensor(list(requests[i][1]), dtype=torch.long, device=logits.device)
            n, end = len(cont), len(inputs[row])
            scored = logits[row, end - n : end].float()  # (n, V): predicts each cont token
            logp = F.log_softmax(scored, dim=-1)
            ll = logp.gather(1, cont[:, None]).double().sum().item()
            out[i] = (ll, bool((scored.argmax(-1) == cont).all()))
    return out  # type: ignore[return-value]


def _tokens(tokenizer, string: str, add_special_tokens: bool | None, add_bos_token,
            prefix_id: int) -> list[int]:  # fmt: skip
    """The harness HF model's ``tok_encode``: the tokenizer's own special tokens unless told
    (``add_bos_token``), and none when the string already starts with the prefix token."""
    kwargs = {}
    if add_special_tokens is not None:
        kwargs["add_special_tokens"] = add_special_tokens
    elif add_bos_token is not None:
        kwargs["add_special_tokens"] = add_bos_token
    if add_special_tokens is None and string.startswith(tokenizer.decode(prefix_id)):
        kwargs["add_special_tokens"] = False
    return list(tokenizer.encode(string, **kwargs))


@functools.cache
def lm_class() -> type:
    """``SAMoELM``: the harness's model interface over :func:`score_requests` (imports
    lm_eval; ImportError names the environment to make when it is absent)."""
    try:
        from lm_eval import utils as lm_utils  # optional: its own env (envs/lm-eval.yaml)
        from lm_eval.api.model import TemplateLM  # optional: its own env
    except ImportError as err:
        raise ImportError(f"lm_eval is not installed here ({err}); the downstream suite runs "
                          f"in its own environment: {ENV_COMMAND} (locally) or envs/lm-eval.yaml "
                          "(the workflow's rule)") from None  # fmt: skip

    class SAMoELM(TemplateLM):
        """An SA-MoE checkpoint as an lm-eval model: loglikelihood requests only."""

        def __init__(self, model: torch.nn.Module, tokenizer, max_len: int,
                     batch_size: int = 16, device: str | torch.device = "cpu",
                     add_bos_token: bool | None = None, name: str = "samoe"):  # fmt: skip
            super().__init__()
            self.model, self.tokenizer, self.max_len = model.eval(), tokenizer, int(max_len)
            self._batch_size, self._device = int(batch_size), torch.device(device)
            self.add_bos_token, self.name = add_bos_token, name

        @property
        def eot_token_id(self) -> int:
            return self.tokenizer.eos_token_id

        @property
        def prefix_token_id(self) -> int:  # BOS where the tokenizer has one, else EOS
            bos = self.tokenizer.bos_token_id
            return self.eot_token_id if bos is None else bos

        @property
        def max_length(self) -> int:
            return self.max_len

        @property
        def batch_size(self) -> int:
            return self._batch_size

        @property
        def tokenizer_name(self) -> str:
            return getattr(self.tokenizer, "name_or_path", "tokenizer").replace("/", "__")

        def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                       left_truncate_len: int | None = None, **kwargs) -> list[int]:  # fmt: skip
            ids = _tokens(self.tokenizer, string, add_special_tokens, self.add_bos_token,
                          self.prefix_token_id)  # fmt: skip
            return ids[-left_truncate_len:] if left_truncate_len else ids

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            answers = score_requests(self.model, [(c, k) for _, c, k in requests],
                                     self.max_len, self._batch_size, self._device)  # fmt: skip
            for (request_str, _, _), answer in zip(requests, answers, strict=True):
                if request_str is not None:
                    self.cache_hook.add_partial("loglikelihood", request_str, answer)
            return answers

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            """Each string's whole log-likelihood in disjoint max_len windows after the prefix
            token (the harness's rolling windows)."""
            out = []
            for (string,) in (req.args for req in requests):
                windows = [lm_utils.make_disjoint_window(w) for w in
                           lm_utils.get_rolling_token_windows(
                               token_list=self.tok_encode(string),
                               prefix_token=self.prefix_token_id,
                               max_seq_len=self.max_len, context_len=1)]  # fmt: skip
                scores = score_requests(self.model, windows, self.max_len, self._batch_size,
                                        self._device)  # fmt: skip
                total = sum(ll for ll, _ in scores)
                self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
                out.append(total)
            return out

        def generate_until(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError(
                "the SA-MoE downstream suite scores log-likelihoods only (SAMOE §11: no "
                "generation); a generative task cannot run on this model"
            )

        def get_model_info(self) -> dict:
            return {"model_name": self.name, "max_length": self.max_len}

    return SAMoELM


def harness_provenance() -> dict[str, str | None]:
    """The installed harness: its version and, where pip installed it from git, the commit
    (``direct_url.json``); None for a registry release."""
    dist = metadata.distribution("lm_eval")
    commit = None
    raw = dist.read_text("direct_url.json")
    if raw:
        commit = json.loads(raw).get("vcs_info", {}).get("commit_id")
    return {"harness_version": dist.version, "harness_commit": commit}


def check_harness(pinned: str | None, allow_other: bool = False) -> dict[str, str | None]:
    """The installed harness's provenance; HarnessError unless it is the ``pinned`` commit
    (``allow_other``: any harness, recorded as it is, for development)."""
    try:
        found = harness_provenance()
    except Exception as err:  # noqa: BLE001 - PackageNotFoundError and friends
        raise HarnessError(f"lm-evaluation-harness is not installed here ({err}); this stage "
                           f"runs in envs/lm-eval.yaml, or locally in {ENV_COMMAND}'s "
                           "environment") from None  # fmt: skip
    if pinned and found["harness_commit"] != pinned and not allow_other:
        got = found["harness_commit"] or f"release {found['harness_version']} (no commit)"
        raise HarnessError(f"downstream.harness_commit pins lm-evaluation-harness {pinned}, "
                           f"but {got} is installed: the requests are the pinned commit's "
                           "(SAMOE §11); use envs/lm-eval.yaml, which installs that "
                           "commit")  # fmt: skip
    return found


def family_tokenizer(corpus_manifest: Mapping, family: str = ""):
    """The ``transformers`` tokenizer the family's corpus was tokenized with (its repository
    and revision from the corpus manifest), refused unless its definition's SHA-256 is the
    one recorded there."""
    rec = corpus_manifest.get("tokenizer") or {}
    if "repo_id" not in rec:
        raise HarnessError(f"the corpus manifest of family {family} records no tokenizer "
                           "(a Hub family's corpus, samoe_hub_corpus, does)")  # fmt: skip
    try:
        tok = load_hf_tokenizer(rec["repo_id"], rec["revision"], family,
                                needs="the downstream suite")  # fmt: skip
    except HubCorpusError as err:
        raise HarnessError(str(err)) from None
    sha = tokenizer_sha256(tok)
    if rec.get("tokenizer_json_sha256") not in (None, sha):
        raise HarnessError(f"the tokenizer of {rec['repo_id']}@{rec['revision']} is not the "
                           f"one the corpus was tokenized with (SHA-256 {sha}, corpus manifest "
                           f"{rec['tokenizer_json_sha256']})")  # fmt: skip
    return tok


def task_manager(task_dir: str | os.PathLike | None = None, include_defaults: bool = True):
    """The harness's task index; ``task_dir`` (local task YAMLs) is searched as well, its
    tasks taking precedence over the harness's own of the same name (``include_defaults``:
    whether the harness's own are indexed at all; seconds)."""
    from lm_eval.tasks import TaskManager  # optional: its own env

    return TaskManager(include_path=str(task_dir) if task_dir else None,
                       include_defaults=include_defaults)  # fmt: skip


def _dataset_of(err: BaseException) -> str:
    """'<dataset_path> (config <dataset_name>)' of the task whose dataset failed to load,
    read from the failing call's frames (the task's ``config`` or ``datasets.load_dataset``'s
    arguments): where the harness keeps a task's config differs between its versions."""
    found = None
    tb = err.__traceback__
    while tb is not None:
        f = tb.tb_frame.f_locals
        cfg = getattr(f.get("self"), "config", None)
        if getattr(cfg, "dataset_path", None):
            found = (cfg.dataset_path, getattr(cfg, "dataset_name", None))
        elif tb.tb_frame.f_code.co_name == "load_dataset" and isinstance(f.get("path"), str):
            found = (f["path"], f.get("name"))
        tb = tb.tb_next
    if found is None:
        return "its dataset"
    path, name = found
    return f"{path}" + (f" (config {name})" if name else "")


def load_tasks(tasks: Sequence[str], manager) -> dict:
    """The harness's task objects of ``tasks`` (their datasets read, through ``datasets``);
    HarnessError naming the task and its dataset, and what to set, when one cannot be read
    (offline without a warm cache) or is unknown."""
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise HarnessError(f"downstream.tasks: {unknown} are not lm-eval tasks here (a task "
                           "of downstream.task_dir or of the installed harness)")  # fmt: skip
    loaded = {}
    for task in tasks:
        try:
            if hasattr(manager, "load"):  # the harness's loader since 0.4.10
                loaded.update(manager.load([task])["tasks"])
            else:
                from lm_eval.tasks import get_task_dict  # optional: its own env

                loaded.update(get_task_dict([task], manager))
        except Exception as err:  # noqa: BLE001 - datasets raises many kinds when offline
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise HarnessError(f"task {task} needs the dataset {_dataset_of(err)}, "
                               f"which could not be read ({type(err).__name__}: {first}). "
                               + OFFLINE_HINT) from None  # fmt: skip
    return loaded


def evaluate(lm, task_dict: Mapping, manager) -> dict:
    """``lm_eval.simple_evaluate`` of ``lm`` on the loaded tasks: zero-shot, no system
    prompt, no chat template, every example (no limit), nothing logged per sample."""
    import lm_eval  # optional: its own env

    return lm_eval.simple_evaluate(
        model=lm, tasks=list(task_dict.values()), num_fewshot=0, task_manager=manager,
        system_instruction=None, apply_chat_template=False, limit=None, log_samples=False,
        use_cache=None, cache_requests=False, write_out=False, check_integrity=False,
    )  # fmt: skip


def _sha256_json(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def result_frame(results: Mapping, tasks: Sequence[str], provenance: Mapping) -> list[dict]:
    """Rows of ``headgeom.samoe.results.HARNESS`` (without the run columns): per task each of
    :data:`METRICS` the harness reports, its value, standard error and example count, the
    task's version and the SHA-256 of its full config as the harness ran it."""
    rows = []
    for task in tasks:
        if task not in results["results"]:
            raise HarnessError(f"the harness returned no results for task {task} (has "
                               f"{sorted(results['results'])})")  # fmt: skip
        got = results["results"][task]
        n = results["n-samples"][task]["effective"]
        reported = [m for m in METRICS if f"{m},none" in got]
        if not reported:
            raise HarnessError(f"task {task}: the harness reported none of {METRICS} "
                               f"(keys {sorted(got)})")  # fmt: skip
        for metric in reported:
            stderr = got.get(f"{metric}_stderr,none")
            rows.append({
                "task": task, "metric": metric, "value": float(got[f"{metric},none"]),
                "stderr": float(stderr) if isinstance(stderr, int | float) else None,
                "n": int(n), "primary": PRIMARY.get(task, "acc") == metric,
                "task_version": str(results["versions"].get(task)),
                "task_config_sha256": _sha256_json(results["configs"][task]),
                "harness_version": provenance["harness_version"],
                "harness_commit": provenance["harness_commit"],
            })  # fmt: skip
    return rows


def quality_rows(frame) -> list[dict]:
    """Quality's accuracy rows from a harness table (``HARNESS`` rows of one run, in task
    order): per task acc and acc_norm where reported and its primary metric; then macro, the
    unweighted mean of the primaries (n: every task's examples)."""
    rows, primaries, total = [], [], 0
    for task, group in frame.groupby("task", sort=False):
        n = int(group["n"].iloc[0])
        for r in group.itertuples(index=False):
            rows.append({"metric": r.metric, "subset": task, "value": float(r.value), "n": n})
        primary = group[group["primary"]]
        if len(primary) != 1:
            raise ValueError(f"harness rows of task {task}: {len(primary)} primary metrics")
        primaries.append(float(primary["value"].iloc[0]))
        total += n
        rows.append({"metric": "primary", "subset": task, "value": primaries[-1], "n": n})
    rows.append({"metric": "primary", "subset": "macro",
                 "value": float(sum(primaries) / len(primaries)), "n": total})  # fmt: skip
    return rows


def read_run_suite(path: str | os.PathLike, manifest: Mapping):
    """One run's harness rows (``HARNESS``), refused unless the file was computed from the
    checkpoint ``manifest`` records (its provenance metadata)."""
    got = metadata_text(read_parquet_metadata(path), "checkpoint_sha256", path)
    if got != manifest["checkpoint_file_sha256"]:
        raise ValueError(f"{path}: computed from checkpoint {got}, not this run's "
                         f"{manifest['checkpoint_file_sha256']}")  # fmt: skip
    return read_table(path, HARNESS.names).to_pandas()
