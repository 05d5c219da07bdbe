"""The fingerprint list: what it covers, that coreutils' ``sha256sum -c`` reads it, and
that a comparison names each difference and the machine fields that could explain it."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import save_file

from headgeom import fingerprints
from headgeom.io import write_manifest
from headgeom.runtime import environment

#: A record with every field a comparison reads (headgeom.runtime.machine; torch comes from
#: the environment beside it).
MACHINE = {
    "cpu": "Test CPU",
    "cpu_vendor": "AuthenticAMD",
    "cpu_vector_width": 256,
    "cpu_capability": "AVX2",
    "blas": "mkl",
    "mkl": "2024.2",
    "onednn": "v3.12.0",
    "numpy_simd": ["X86_V3"],
    "blas_libraries": [],
    "intra_op_threads": 2,
    "gpu": None,
    "kernel_variables": {"MKL_CBWR": "AVX2"},
}


def results_folder(root, machine=MACHINE):
    for model in ("learned", "write-common-axis"):
        run = root / "models" / model / "s42"
        run.mkdir(parents=True)
        save_file({"w": torch.arange(6.0).reshape(2, 3)}, run / "model.safetensors")
        record = {"environment": {"torch": "2.13.0", "machine": machine}}
        write_manifest(run / "manifest.json", record)
    (root / "tables").mkdir()
    (root / "tables" / "table3.csv").write_text("model,n_eff\nlearned,9.9\n")
    (root / "tables" / "table3.md").write_text("| model | n_eff |\n")  # not data: not covered
    (root / "figures").mkdir()
    (root / "figures" / "figure5.csv").write_text("layer,head,e\n0,0,0.5\n")
    (root / "logs").mkdir()
    (root / "logs" / "train.log").write_text("not an artifact\n")
    return root


def test_collect_covers_checkpoints_tables_and_figure_data(tmp_path):
    prints = fingerprints.collect(results_folder(tmp_path / "demo"))
    assert sorted(prints.sha256) == [
        "figures/figure5.csv",
        "models/learned/s42/model.safetensors",
        "models/write-common-axis/s42/model.safetensors",
        "tables/table3.csv",
    ]
    expected = hashlib.sha256(b"model,n_eff\nlearned,9.9\n").hexdigest()
    assert prints.sha256["tables/table3.csv"] == expected
    assert prints.machines == [{**MACHINE, "torch": "2.13.0"}]


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils sha256sum")
def test_the_list_is_what_sha256sum_checks(tmp_path):
    root = results_folder(tmp_path / "demo")
    listing = tmp_path / "demo.sha256"
    listing.write_text(fingerprints.collect(root).text("demo"))
    ok = subprocess.run(["sha256sum", "-c", "--strict", str(listing)], cwd=root,
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count(": OK") == 4
    (root / "figures" / "figure5.csv").write_text("layer,head,e\n0,0,0.6\n")
    bad = subprocess.run(["sha256sum", "-c", str(listing)], cwd=root,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and "figure5.csv: FAILED" in bad.stdout


def test_check_names_each_difference_and_the_machine_fields(tmp_path, capsys):
    published = tmp_path / "demo.sha256"
    published.write_text(fingerprints.collect(results_folder(tmp_path / "a")).text("demo"))
    # the same bytes on another machine: reproduced, the machine difference still shown
    other = {**MACHINE, "cpu": "Other CPU", "cpu_capability": "AVX512"}
    run = results_folder(tmp_path / "b", machine=other)
    assert fingerprints.main(["check", str(run), "--published", str(published)]) == 0
    out = capsys.readouterr().out
    assert "checkpoints    2 of   2 equal" in out and out.rstrip().endswith("reproduced")
    assert "cpu_capability: 'AVX2' → 'AVX512'" in out
    # a checkpoint changed, a table missing
    save_file({"w": torch.ones(2, 3)}, run / "models" / "learned" / "s42" / "model.safetensors")
    (run / "tables" / "table3.csv").unlink()
    assert fingerprints.main(["check", str(run), "--published", str(published)]) == 1
    out = capsys.readouterr().out
    assert "checkpoints    1 of   2 equal" in out
    assert "differs: models/learned/s42/model.safetensors" in out
    assert "missing: tables/table3.csv" in out
    assert "different kernels give different bytes" in out and "NOT reproduced" in out


def test_an_unfinished_run_is_told_to_finish_not_blamed_on_kernels(tmp_path, capsys):
    published = tmp_path / "demo.sha256"
    published.write_text(fingerprints.collect(results_folder(tmp_path / "a")).text("demo"))
    run = results_folder(tmp_path / "b", machine={**MACHINE, "cpu_capability": "AVX512"})
    (run / "figures" / "figure5.csv").unlink()
    assert fingerprints.main(["check", str(run), "--published", str(published)]) == 1
    out = capsys.readouterr().out
    assert "missing: figures/figure5.csv" in out and "finish the workflow" in out
    assert "kernels differ" not in out


def test_a_difference_on_the_same_machine_is_not_blamed_on_kernels(tmp_path, capsys):
    published = tmp_path / "demo.sha256"
    published.write_text(fingerprints.collect(results_folder(tmp_path / "a")).text("demo"))
    run = results_folder(tmp_path / "b")
    (run / "tables" / "table3.csv").write_text("model,n_eff\nlearned,9.8\n")
    assert fingerprints.main(["check", str(run), "--published", str(published)]) == 1
    out = capsys.readouterr().out
    # the records agree: it says so, and not that the kernels were the same
    assert "every recorded kernel choice and the CPU agree" in out
    assert "a kernel path the record does not capture remains possible" in out
    assert "not a kernel difference" not in out


OPENBLAS = {"package": "numpy", "library": "openblas", "version": "0.3.31", "threads": 1}


def test_the_issues_case_an_openblas_core_the_old_record_did_not_hold(tmp_path, capsys):
    """A list published before the record held numpy's BLAS, against a run whose QR went
    through another OpenBLAS core: it cannot tell, and says so."""
    published = tmp_path / "demo.sha256"
    published.write_text(fingerprints.collect(results_folder(tmp_path / "a")).text("demo"))
    machine = {**MACHINE, "blas_libraries": [{**OPENBLAS, "core": "SkylakeX"}]}
    old = {k: v for k, v in MACHINE.items() if k not in ("blas_libraries", "numpy_simd")}
    published.write_text(
        fingerprints.collect(results_folder(tmp_path / "old", machine=old)).text("demo")
    )
    run = results_folder(tmp_path / "b", machine=machine)
    save_file({"w": torch.ones(2, 3)}, run / "models" / "learned" / "s42" / "model.safetensors")
    assert fingerprints.main(["check", str(run), "--published", str(published)]) == 1
    out = capsys.readouterr().out
    assert "not in both records: numpy_simd, blas_libraries" in out
    assert "whether those kernels differ cannot be told" in out
    assert "agree" not in out
    # a published record that holds it names the core that differs
    haswell = {**MACHINE, "blas_libraries": [{**OPENBLAS, "core": "Haswell"}]}
    published.write_text(
        fingerprints.collect(results_folder(tmp_path / "c", machine=haswell)).text("demo")
    )
    assert fingerprints.main(["check", str(run), "--published", str(published)]) == 1
    out = capsys.readouterr().out
    assert "blas_libraries: " in out and "'Haswell'" in out and "'SkylakeX'" in out
    assert "the kernels differ" in out


def test_other_cpus_with_the_same_recorded_kernels_are_named_not_cleared(tmp_path, capsys):
    base = MACHINE
    published = tmp_path / "demo.sha256"
    published.write_text(
        fingerprints.collect(results_folder(tmp_path / "a", machine=base)).text("demo")
    )
    intel = {**base, "cpu_vendor": "GenuineIntel", "cpu_vector_width": 512}
    run = results_folder(tmp_path / "b", machine=intel)
    (run / "figures" / "figure5.csv").write_text("layer,head,e\n0,0,0.7\n")
    assert fingerprints.main(["check", str(run), "--published", str(published)]) == 1
    out = capsys.readouterr().out
    assert "cpu_vendor: 'AuthenticAMD' → 'GenuineIntel'" in out
    assert "every recorded kernel choice agrees, but the CPUs differ" in out


def test_the_closest_of_several_published_machines_is_compared(tmp_path, capsys):
    listing = tmp_path / "demo.sha256"
    first = fingerprints.collect(results_folder(tmp_path / "a"))
    avx512 = {**MACHINE, "cpu": "Other CPU", "cpu_capability": "AVX512"}
    listing.write_text(fingerprints.with_machine(first, {**avx512, "torch": "2.13.0"}).text("demo"))
    assert len(fingerprints.parse(listing.read_text(), "x").machines) == 2
    run = results_folder(tmp_path / "b", machine=avx512)
    assert fingerprints.main(["check", str(run), "--published", str(listing)]) == 0
    out = capsys.readouterr().out
    assert "machine (" not in out and out.rstrip().endswith("reproduced")


def test_record_adds_a_machine_that_reproduced_the_list_and_only_then(tmp_path, capsys):
    listing = tmp_path / "demo.sha256"
    listing.write_text(fingerprints.collect(results_folder(tmp_path / "a")).text("demo"))
    other = {**MACHINE, "cpu": "Other CPU"}
    run = results_folder(tmp_path / "b", machine=other)
    assert fingerprints.main(["record", str(run), "--published", str(listing)]) == 0
    machines = fingerprints.parse(listing.read_text(), "x").machines
    assert machines == [{**MACHINE, "torch": "2.13.0"}, {**other, "torch": "2.13.0"}]
    assert fingerprints.main(["record", str(run), "--published", str(listing)]) == 0
    assert len(fingerprints.parse(listing.read_text(), "x").machines) == 2  # once
    before = listing.read_text()
    (run / "tables" / "table3.csv").write_text("model,n_eff\nlearned,1.0\n")
    assert fingerprints.main(["record", str(run), "--published", str(listing)]) == 1
    assert listing.read_text() == before
    capsys.readouterr()


def test_the_timed_tables_are_the_samoe_tables_built_from_wall_clock_times():
    """TIMED leaves out exactly the SA-MoE paper tables whose builders read the audit-cost
    or runtime measurements (columns of seconds on this machine)."""
    import inspect

    from headgeom.samoe import paper as samoe_paper
    from headgeom.samoe import results as samoe_results

    assert "wall_s" in samoe_results.AUDIT_COST.names
    assert "median_s" in samoe_results.RUNTIME.names
    timed = {name for name, build in samoe_paper.TABLES.items()
             if re.search(r"\bx\.(audit_cost|runtime)\b", inspect.getsource(build))}  # fmt: skip
    assert {f"samoe/tables/{name}.csv" for name in timed} == fingerprints.TIMED


def test_the_samoe_layout_is_covered_without_its_timings(tmp_path):
    root = tmp_path / "samoe-demo"
    for run in ("samoe/toy/dense", "samoe/toy/persistent/s42"):
        (root / run).mkdir(parents=True)
        save_file({"w": torch.zeros(2)}, root / run / "model.safetensors")
        write_manifest(root / run / "manifest.json",
                       {"environment": {"torch": "2.13.0", "machine": MACHINE}})  # fmt: skip
    (root / "samoe" / "tables").mkdir()
    for table in ("table2", "table13", "table5"):
        (root / "samoe" / "tables" / f"{table}.csv").write_text("a\n1\n")
    (root / "samoe" / "figures").mkdir()
    (root / "samoe" / "figures" / "ledger.csv").write_text("a\n1\n")
    assert sorted(fingerprints.collect(root).sha256) == [
        "samoe/figures/ledger.csv",
        "samoe/tables/table2.csv",
        "samoe/toy/dense/model.safetensors",
        "samoe/toy/persistent/s42/model.safetensors",
    ]
    assert fingerprints.published_for(root).name == "samoe-demo.sha256"


def test_bad_input_is_named(tmp_path, capsys):
    run = results_folder(tmp_path / "demo")
    bad = tmp_path / "bad.sha256"
    bad.write_text("# header\nnot-a-digest  tables/table3.csv\n")
    assert fingerprints.main(["check", str(run), "--published", str(bad)]) == 2
    assert f"{bad}:2: expected '<sha256>  <path>'" in capsys.readouterr().err
    assert fingerprints.main(["check", str(tmp_path / "nowhere")]) == 2
    assert "not a results folder" in capsys.readouterr().err


def test_the_machine_record_has_every_field_a_comparison_reads():
    machine = fingerprints.machine_of(environment())
    missing = [f for f in fingerprints.MACHINE_FIELDS if f not in machine]
    assert not missing
    # numpy's and scipy's BLAS, with the kernels each chose
    assert {lib["package"] for lib in machine["blas_libraries"]} >= {"numpy", "scipy"}
    assert all(lib["core"] or lib["library"] != "openblas" for lib in machine["blas_libraries"])


def test_the_published_list_is_the_default_study_as_it_is_now():
    """docs/reproducibility/demo.sha256 names every checkpoint, table and figure the default
    study makes (regenerate it with ``write`` when the study gains or loses one)."""
    import yaml

    from headgeom.heads.paper.plan import PaperPlan
    from headgeom.heads.study import Study

    config = yaml.safe_load(
        (fingerprints.PUBLISHED.parents[2] / "config" / "config.yaml").read_text()
    )
    study = Study.from_config(config)
    plan = PaperPlan(study)
    expected = {f"models/{m}/s{s}/model.safetensors" for m, s in study.runs}
    expected |= {f"tables/{t}.csv" for t in (*plan.tables, *plan.document_tables)}
    expected |= {f"figures/{f}.csv" for f in plan.figures}
    published = fingerprints.parse(fingerprints.PUBLISHED.read_text(), "demo.sha256")
    assert set(published.sha256) == expected
    assert published.machines, "the list names no machine that produced it"
    for machine in published.machines:  # every machine that produced it ran under the pin
        assert machine["kernel_variables"]["ATEN_CPU_CAPABILITY"] == "avx2"


def test_the_samoe_published_list_is_the_samoe_demo_as_it_is_now():
    """docs/reproducibility/samoe-demo.sha256 names the SA-MoE demo's dense and MoE
    checkpoints and every paper table and figure but the timed ones, and was written under
    the pin."""
    import yaml

    from headgeom.samoe import paper as samoe_paper
    from headgeom.samoe.study import SAMoEStudy

    root = fingerprints.PUBLISHED_DIR.parents[1]
    study = SAMoEStudy.from_config(yaml.safe_load((root / "config" / "samoe.yaml").read_text()))
    expected = {f"samoe/{f}/dense/model.safetensors" for f in study.toy_families}
    expected |= {f"samoe/{f}/{v}/s{s}/model.safetensors" for f, v, s in study.runs}
    expected |= {f"samoe/tables/{t}.csv" for t in samoe_paper.TABLES}
    expected |= {f"samoe/figures/{f}.csv" for f in samoe_paper.FIGURES}
    listing = fingerprints.PUBLISHED_DIR / "samoe-demo.sha256"
    published = fingerprints.parse(listing.read_text(), listing.name)
    assert set(published.sha256) == expected - fingerprints.TIMED
    for machine in published.machines:
        assert machine["kernel_variables"]["OPENBLAS_CORETYPE"] == "Haswell"
        assert {lib["core"] for lib in machine["blas_libraries"]} == {"Haswell"}
