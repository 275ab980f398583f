"""The generated tables of README.md and docs/benchmarks.md match the committed results files
(benchmarks/tables.py writes them), the README stays short, and the relative links of the
pages the tables live on point at files that exist. No training: it only reads files."""

from __future__ import annotations

import re

import pytest

from benchmarks import tables

README_LIMIT = 12_000  # bytes
LINKED_PAGES = ["README.md", "docs/benchmarks.md", "docs/cli.md", "docs/guarantees.md", "docs/architecture.md"]


@pytest.mark.parametrize("doc", sorted(tables.DOCS))
def test_generated_tables_are_current(doc):
    text = (tables.ROOT / doc).read_text()
    want, found = tables.DOCS[doc](), tables.blocks(text)
    assert set(found) == set(want), (
        f"{doc} has the generated blocks {sorted(found)}, the script writes {sorted(want)}: "
        "run python -m benchmarks.tables")
    stale = [name for name in want if found[name] != want[name]]
    assert not stale, (f"{doc}: the tables {stale} differ from what the results files give (or src/ moved on "
                       "since they were written): run python -m benchmarks.tables")


def test_every_table_names_its_results_file():
    for doc, render in tables.DOCS.items():
        for name, body in render().items():
            for link in re.findall(r"\]\(((?:\.\./)?benchmarks/results/[^)]+\.json)\)", body) or [None]:
                assert link, f"{doc}, table {name}: no results file named"
                assert (tables.ROOT / doc).parent.joinpath(link).resolve().is_file(), f"{doc}: {link} is missing"


def test_readme_is_short():
    size = len((tables.ROOT / "README.md").read_bytes())
    assert size < README_LIMIT, f"README.md is {size:,} bytes; keep it under {README_LIMIT:,} (details go in docs/)"


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_relative_links_exist(page):
    path = tables.ROOT / page
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    missing = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert not missing, f"{page} links to missing files: {missing}"


def test_the_code_map_lists_every_module():
    """docs/architecture.md's code map names every module under src/equipoise/, and no
    module that does not exist."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", text[text.index("## Code map"):], re.M))
    modules = {str(f.relative_to(root / "src" / "equipoise")) for f in (root / "src" / "equipoise").rglob("*.py")}
    assert not modules - listed, f"modules missing from docs/architecture.md's code map: {sorted(modules - listed)}"
    assert not listed - modules, f"the code map names modules that do not exist: {sorted(listed - modules)}"


def prose_digits(text: str) -> list[str]:
    """The lines of a page's hand-written prose that hold a digit: outside generated
    blocks, code, link targets, headings' section numbers, § references, Greek symbols'
    subscripts (α0) and citations (link texts ending in a year)."""
    text = tables.MARKER.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\[[^\]]*\b(19|20)\d\d\]\([^)]*\)", "", text)  # [Authors, VENUE YEAR](references.md#…)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"^#+ \d+\. ", "", text, flags=re.M)
    text = re.sub(r"§\d+|[α-ω]\d", "", text)
    return [line for line in text.splitlines() if re.search(r"\d", line)]


@pytest.mark.parametrize("doc", ["README.md", "docs/benchmarks.md"])
def test_no_measurement_is_typed_in_the_prose(doc):
    """Every number on these pages comes from the generator: the prose holds none (the
    README's citations, versions and settings aside, which are not measurements)."""
    lines = prose_digits((tables.ROOT / doc).read_text())
    if doc == "README.md":  # the citations' venues, the supported versions, the default job's settings
        allowed = re.compile(r"(ICDM|SoCC) 20\d\d|Python ≥ 3\.\d+|^2\.60\.0 |torch 2\.11 to 2\.13\.0|"
                             r"Fashion-MNIST, \d+$|^workers, \d+ servers")
        lines = [line for line in lines if not allowed.search(line)]
    assert not lines, f"{doc}: typed numbers in the prose (generate them, or say it without): {lines}"


def test_prose_digits_finds_a_typed_number():
    assert prose_digits("LB-BSP reached 2.57× BSP.\n<!-- tables:x -->\n| 3 |\n<!-- /tables:x -->\n")
    assert not prose_digits("## 5. PSLD\n[Chen et al., SoCC 2020](references.md#c) and §13, `--reps 3`.")
