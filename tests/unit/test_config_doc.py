"""config/README.md is generated from the config schemas (headgeom.config_doc): the committed
file is current, every parameter of both study kinds is in it with a description, and a
parameter's row is rendered from its schema, by hand here."""

from __future__ import annotations

import yaml

from headgeom import config_doc


def test_the_committed_config_readme_is_current():
    assert config_doc.DOC.read_text() == config_doc.render(), "run: python -m headgeom.config_doc"
    assert config_doc.main(["--check"]) == 0


def test_every_parameter_has_a_description():
    assert config_doc.undescribed() == [], "add a description to the schema"


def test_one_section_per_study_kind_with_every_top_level_key():
    text = config_doc.DOC.read_text()
    for kind in config_doc.KINDS:
        assert f"## {kind.title}\n" in text
        schema = config_doc.load_schema(kind.schema)
        for key in schema["properties"]:
            assert f"| `{key}` |" in text or f"### `{key}`" in text, (kind.schema, key)
    # nested and placeholder paths: a model's key, a list item's key, a rule's resources
    for path in ("models.<name>.geometry", "concentration.pairs[].seed_a",
                 "resources.<rule>.mem_mb", "families.<name>.dense.n_layer"):  # fmt: skip
        assert f"| `{path}` |" in text, path


def test_a_parameter_row_is_its_schema():
    schema = yaml.safe_load(
        """
        definitions:
          sizes: {type: array, minItems: 2, maxItems: 2, items: {type: integer, minimum: 0}}
        properties:
          block:
            type: object
            required: [n]
            properties:
              n: {type: integer, minimum: 1, multipleOf: 4, description: "examples | rows"}
              mode: {type: string, enum: [zero, mean], default: zero, description: "a mode"}
              pair: {$ref: "#/definitions/sizes", description: "two sizes"}
        """
    )
    rows = list(config_doc.parameters(schema["properties"]["block"], schema, "block", False))
    assert [r.path for r in rows] == ["block", "block.n", "block.mode", "block.pair"]
    assert config_doc.table(rows[1:]) == (
        "| Parameter | Type | Default | Allowed | Description |\n"
        "|---|---|---|---|---|\n"
        "| `block.n` | integer | *required* | ≥ 1; multiple of 4 | examples \\| rows |\n"
        "| `block.mode` | string | `zero` | `zero`, `mean` | a mode |\n"
        "| `block.pair` | list of integer | — | exactly 2 items; each: ≥ 0 | two sizes |\n"
    )


def test_a_stale_readme_is_reported_and_rewritten(tmp_path, capsys):
    out = tmp_path / "README.md"
    out.write_text(config_doc.render().replace("| integer |", "| float |", 1))
    assert config_doc.main(["--check", "--out", str(out)]) == 1
    assert "stale" in capsys.readouterr().err
    assert config_doc.main(["--out", str(out)]) == 0
    assert out.read_text() == config_doc.render()
