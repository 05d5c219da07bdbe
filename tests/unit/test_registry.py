"""The model registry: every registered geometry builds, declares what its modules are, and its
architecture's capability flags are what the fast patching engine really does; the config
schema's geometry list is the registry's; the model package imports without cycles; and no
geometry or architecture name is compared as a string, nor a reader probed with hasattr,
outside the registry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from headgeom.heads.analysis.patching import (
    patch_batch,
    patch_batch_fast,
    supports_fast,
    supports_prefix_reuse,
)
from headgeom.heads.analysis.tolerance import forward_tolerance
from headgeom.model import registry, zoo
from headgeom.model.checkpoint import load_checkpoint, save_checkpoint
from headgeom.model.geometries import BlockReader, FreeReader, LearnedWriter
from headgeom.model.interop import require_learned
from tests.tolerances import largest, patch_tolerance

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
ALL = registry.geometry_names()
#: Small base architectures: TINY for most geometries (Kerdock D = 16), THREE_HEADS where a
#: geometry needs 3 | H (routed controls; multiscreen also needs 4 | L and 4 | d).
TINY = dict(n_layer=2, n_head=4, d_model=16, d_head=4, d_mlp=24, n_ctx=16)
THREE_HEADS = dict(n_layer=4, n_head=3, d_model=24, d_head=8, d_mlp=24, n_ctx=16)
N_VOCAB = 19
#: Restated from docs §4.3.1 and §6: the geometries whose heads read one block each.
BLOCK_READERS = {"read-common", "all-common-axis", "all-rotated", "all-rotated-self"}
MULTISCREEN = {"multiscreen-learned", "multiscreen-identity"}


def model_config(geometry: str) -> dict:
    try:
        return zoo.derive_model_config(geometry, TINY)
    except ValueError:
        return zoo.derive_model_config(geometry, THREE_HEADS)


def built(geometry: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return registry.build_model(model_config(geometry), N_VOCAB).eval()


def perturbed(model: nn.Module, seed: int = 1) -> nn.Module:
    """Trainable weights large enough that every head moves the answer."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(
                (1.0 + 0.3 * noise) if "ln" in name and name.endswith("weight") else noise * 0.3
            )
    return model


# --------------------------------------------------------------------------- the list
def test_the_schema_lists_exactly_the_registered_geometries():
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "heads.schema.yaml").read_text())
    geometry = schema["properties"]["models"]["additionalProperties"]["properties"]["geometry"]
    assert geometry["enum"] == list(ALL)


def test_the_study_has_its_17_geometries_in_two_architectures():
    assert len(ALL) == len(set(ALL)) == 17
    assert set(registry.geometry_names("multiscreen")) == MULTISCREEN
    assert set(registry.geometry_names("gpt")) == set(ALL) - MULTISCREEN
    # a wrapped transformers model (headgeom.model.hf) has no study geometry
    assert set(registry.ARCHITECTURES) == {"gpt", "multiscreen", "hf-causal-lm"}
    assert registry.geometry_names("hf-causal-lm") == ()
    for name in ALL:
        assert registry.geometry(name).architecture in registry.ARCHITECTURES
    with pytest.raises(ValueError, match="unknown geometry 'spiral'"):
        registry.geometry("spiral")
    with pytest.raises(ValueError, match="unknown architecture 'rnn'"):
        registry.geometry_names("rnn")


# --------------------------------------------------------------------------- declarations
@pytest.mark.parametrize("geometry", ALL)
def test_every_geometry_builds_and_declares_what_its_modules_are(geometry):
    spec = registry.geometry(geometry)
    model = built(geometry)
    arch = registry.architecture_of(model)
    assert arch is registry.architecture(spec.architecture)
    assert type(model) is arch.model and isinstance(model.cfg, arch.config)
    assert registry.geometry_of(model.cfg) is spec
    for block in model.blocks:
        reader = block.attn.reader
        assert isinstance(reader, BlockReader) == (spec.reader == "block"), geometry
        # a shared LN_1 (one LayerNorm over D before W_QKV) is what leakage relies on
        ln_1 = getattr(reader, "ln_1", None)
        assert isinstance(ln_1, nn.LayerNorm) == spec.shared_ln1, geometry
        if spec.shared_ln1:
            assert ln_1.normalized_shape == (model.cfg.d_model,)
    assert registry.reader_kind(geometry) == ("block" if geometry in BLOCK_READERS else "free")
    assert registry.has_shared_ln1(geometry) == (geometry not in BLOCK_READERS | MULTISCREEN)
    if geometry in MULTISCREEN:  # tiles read the raw residual: no LayerNorm anywhere
        assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())


def test_free_readers_are_what_leakage_needs():
    """Leakage (§11.1) defaults to the geometries with a shared LN_1 before learned W_QKV."""
    gpt = registry.geometry_names("gpt")
    free = {g for g in ALL if registry.has_shared_ln1(g)}
    assert free == set(gpt) - BLOCK_READERS
    for geometry in gpt:
        reader = built(geometry).blocks[0].attn.reader
        assert hasattr(reader, "ln_1") == registry.has_shared_ln1(geometry), geometry


@pytest.mark.parametrize("geometry", ALL)
def test_the_named_sites_are_the_declared_ones_with_their_axes(geometry):
    model = built(geometry)
    sites = registry.architecture_of(model).sites
    per_block = [s for s in sites if s != "hook_resid_final"]
    expected = {f"blocks.{layer}.{s}" for layer in range(model.cfg.n_layer) for s in per_block}
    assert set(model.hook_points()) == expected | {"hook_resid_final"}
    ids = torch.arange(6)[None].repeat(2, 1) % N_VOCAB
    _, cache = model.run_with_cache(ids, sorted(expected | {"hook_resid_final"}))
    for name, value in cache.items():
        axes = sites[name.split(".", 2)[2] if name.startswith("blocks.") else name]
        assert value.dim() == len(axes), name
        assert value.shape[:2] == (2, 6), name  # (batch, position, ...)
        if "head" in axes:
            assert value.shape[axes.index("head")] == model.cfg.n_head, name


def test_only_learned_has_a_gpt2_form_and_is_the_baseline():
    assert [g for g in ALL if registry.has_gpt2_form(g)] == ["learned"]
    assert [g for g in ALL if registry.is_baseline(g)] == ["learned"]
    for geometry in ALL:
        model = built(geometry)
        if registry.has_gpt2_form(geometry):  # GPT-2's modules exactly
            require_learned(model)
            assert all(type(b.attn.reader) is FreeReader for b in model.blocks)
            assert all(type(b.attn.writer) is LearnedWriter for b in model.blocks)
        else:
            with pytest.raises(ValueError, match="only the 'learned' geometry"):
                require_learned(model)


# --------------------------------------------------------------------------- capabilities
@pytest.mark.parametrize("geometry", ALL)
def test_answer_logits_are_the_forward_logits(geometry):
    model = perturbed(built(geometry))
    arch = registry.architecture_of(model)
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, N_VOCAB, (3, 7)))
    last = f"blocks.{model.cfg.n_layer - 1}.hook_resid_pre"
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, [last], last_only=True)
        x = model.blocks[-1](cache[last])  # the residual leaving the last block
        answers = torch.tensor([[1, 4], [0, 2], [7, 3]])
        got = model.answer_logits(x, answers)
    assert arch.fast_patching
    # the routes part at the last block (re-run from its cached input): 2 stages at the
    # largest |logit|
    tol = forward_tolerance(model, largest(logits), from_layer=model.cfg.n_layer - 1)
    torch.testing.assert_close(got, logits.gather(1, answers), rtol=0, atol=tol)


@pytest.mark.parametrize("geometry", ALL)
def test_prefix_reuse_is_declared_exactly_where_the_engine_reuses_and_stays_exact(geometry):
    model = perturbed(built(geometry))
    arch = registry.architecture_of(model)
    assert supports_fast(model) == arch.fast_patching
    assert supports_prefix_reuse(model) == arch.prefix_reuse
    kv_forward = [callable(getattr(b, "forward_suffix", None)) for b in model.blocks]
    assert all(kv_forward) == arch.prefix_reuse  # the declaration matches the blocks
    rng = np.random.default_rng(3)
    clean = torch.as_tensor(rng.integers(0, N_VOCAB, (3, 8)))
    ref = clean.clone()
    ref[:, 4:] = (ref[:, 4:] + 1) % N_VOCAB  # a shared clean prefix of 4 positions
    correct, incorrect = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    naive = patch_batch(model, clean, ref, correct, incorrect)
    fast = patch_batch_fast(model, clean, ref, correct, incorrect, max_rows=5, prefix_reuse=True)
    tol = patch_tolerance(model, clean, ref)  # routes part at block 0: L + 1 stages
    for a, b in zip(naive, fast, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=tol)
    assert (naive[0][:, None, None] - naive[1]).abs().max() > 1e-3  # not vacuous


def test_a_model_type_the_registry_does_not_know_gets_no_capability():
    model = built("learned")
    model.__class__ = type("OtherLM", (nn.Module,), dict(vars(type(model))))
    assert registry.architecture_of(model) is None
    assert not supports_fast(model) and not supports_prefix_reuse(model)
    with pytest.raises(ValueError, match="OtherLM"):
        require_learned(model)


# --------------------------------------------------------------------------- one builder
@pytest.mark.parametrize("geometry", ["all-rotated", "multiscreen-identity"])
def test_one_builder_rebuilds_a_checkpoint_byte_for_byte(geometry, tmp_path):
    model = built(geometry, seed=4)
    save_checkpoint(tmp_path / "a.safetensors", model, np.arange(N_VOCAB))
    loaded, _ = load_checkpoint(tmp_path / "a.safetensors")
    assert type(loaded) is type(model) and loaded.cfg == model.cfg
    save_checkpoint(tmp_path / "b.safetensors", loaded, np.arange(N_VOCAB))
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    torch.manual_seed(4)
    again = registry.build_model(model.cfg.to_dict())  # same seed, same initial bytes
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert a.numpy().tobytes() == b.numpy().tobytes(), name


def test_config_from_dict_picks_the_architecture():
    gpt = {**model_config("learned"), "n_vocab": N_VOCAB}
    ms = {**model_config("multiscreen-learned"), "n_vocab": N_VOCAB}
    assert "architecture" not in gpt  # stored GPT configs never had the key
    assert registry.config_from_dict(gpt).architecture == "gpt"
    assert registry.config_from_dict(ms).architecture == "multiscreen"
    with pytest.raises(ValueError, match="unknown architecture 'rnn'"):
        registry.config_from_dict({**ms, "architecture": "rnn"})
    with pytest.raises(ValueError, match="d_key"):
        registry.config_from_dict({**gpt, "d_key": 4})  # a multiscreen key in a GPT config


def test_basis_family_only_for_geometries_with_kerdock_bases():
    uses = {"write-common", "write-rotated", "all-rotated", "all-rotated-self"}
    for geometry in ALL:
        family = registry.basis_family(built(geometry).cfg)
        assert (family is not None) == (geometry in uses), geometry


# --------------------------------------------------------------------------- structure
def _module_imports(path: Path) -> set[str]:
    """Every ``headgeom.model.*`` module a file imports, at any depth (TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "headgeom.model":
                found |= {f"headgeom.model.{a.name}" for a in node.names}
            elif node.module.startswith("headgeom.model."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("headgeom.model.")}
    return found


def test_the_model_package_imports_without_cycles():
    package = SRC / "headgeom" / "model"
    graph = {
        f"headgeom.model.{p.stem}": _module_imports(p)
        for p in package.glob("*.py")
        if p.stem != "__init__"
    }
    state: dict[str, str] = {}

    def visit(module: str, path: tuple[str, ...]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", f"import cycle: {' -> '.join((*path, module))}"
        state[module] = "open"
        for dep in graph.get(module, ()):
            visit(dep, (*path, module))
        state[module] = "done"

    for module in graph:
        visit(module, ())


#: Where geometry names may stand as data: the registry, and the run-set table's defaults
#: (the paper's geometries of each analysis, declared once there).
REGISTRY_FILES = {"src/headgeom/model/registry.py", "src/headgeom/model/geometries.py",
                  "src/headgeom/model/facts.py", "src/headgeom/heads/run_sets.py"}  # fmt: skip
NAMES = set(ALL) | set(registry.ARCHITECTURES) | {registry.geometry(g).stored_geometry for g in ALL}
_PROBED = re.compile(r"reader|writer|cfg|config|model|block|attn")
_MODEL_ATTRIBUTES = {
    "ln_1", "ln_f", "wte", "s_f", "geometry", "geometry_params", "architecture", "reader",
    "writer", "c_attn", "c_proj", "basis", "hook_z", "hook_resid_pre", "forward_suffix", "after_z",
}  # fmt: skip


def _name_sites(path: Path) -> list[str]:
    """Comparisons of a string literal that is a geometry or architecture name (or a prefix
    of one in ``startswith``), tuples of such names, and ``hasattr`` on models, configs,
    blocks, readers or writers."""
    text = path.read_text()
    if path.suffix == ".smk":  # Snakemake syntax: a textual check
        quoted = "|".join(re.escape(n) for n in NAMES)
        pattern = rf"""(==|!=|\bin)\s*\(?\s*["']({quoted})["']|MULTISCREEN_GEOMETRIES|hasattr\("""
        return [m.group(0) for m in re.finditer(pattern, text)]
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                elts = side.elts if isinstance(side, ast.Tuple | ast.Set | ast.List) else [side]
                if any(isinstance(e, ast.Constant) and e.value in NAMES for e in elts):
                    found.append(f"{path.name}:{node.lineno} compares a name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if fn in ("startswith", "endswith") and any(
                isinstance(a, str) and len(a) > 3 and any(n.startswith(a) for n in NAMES)
                for a in args
            ):
                found.append(f"{path.name}:{node.lineno} {fn}({args[0]!r})")
            probed = node.args and _PROBED.search(ast.unparse(node.args[0]))
            if fn == "hasattr" and (probed or set(args) & _MODEL_ATTRIBUTES):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            if node.value.elts and all(
                isinstance(e, ast.Constant) and e.value in NAMES for e in node.value.elts
            ):
                found.append(f"{path.name}:{node.lineno} a tuple of names")
    return found


def test_no_name_is_compared_and_no_reader_is_probed_outside_the_registry():
    files = [*SRC.rglob("*.py"), *(REPO / "workflow" / "heads").glob("*.smk")]
    offenders = {}
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        if rel in REGISTRY_FILES:
            continue
        if sites := _name_sites(path):
            offenders[rel] = sites
    assert not offenders


def test_every_geometry_has_its_facts_and_the_registry_reads_them():
    from headgeom.model import facts

    assert list(facts.FACTS) == list(registry.GEOMETRIES)  # one name list, schema order
    for name, record in registry.GEOMETRIES.items():
        known = facts.facts(name)
        assert (record.architecture, record.reader, record.shared_ln1) == (
            known.architecture, known.reader, known.shared_ln1
        )  # fmt: skip
        assert registry.reader_kind(name) == known.reader
        # a block reader reads one fixed block: never behind a shared LN_1 (docs §4.3.1)
        assert not (known.reader == facts.BLOCK and known.shared_ln1)
    assert [n for n in facts.FACTS if facts.is_baseline(n)] == ["learned"]
    assert [n for n in facts.FACTS if facts.has_gpt2_form(n)] == ["learned"]
    with pytest.raises(ValueError, match="unknown geometry 'lerned'; known: .*'learned'"):
        facts.facts("lerned")
    # a stored model config names its study geometry (multiscreen: the tiles' write geometry)
    for name, record in registry.GEOMETRIES.items():
        stored = {"architecture": record.architecture, "geometry": record.stored_geometry}
        assert facts.study_geometry(stored) == name
    assert facts.study_geometry({"architecture": "multiscreen", "geometry": "learned"}) == (
        "multiscreen-learned"
    )
    # a pretrained causal LM has no designed geometry: it is the unconstrained baseline
    assert facts.study_geometry({"architecture": "hf-causal-lm", "family": "llama"}) == "learned"
