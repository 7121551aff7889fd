"""How validation results are stored: compact JSON, the code a run measured recorded as a commit
(not copied sources), and an index README that names every folder."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import validation.suite as vs

from .test_suite import DEVICE, SMALL, fake_measure

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "validation" / "results"
HAS_GIT = shutil.which("git") is not None and (ROOT / ".git").exists()


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def test_large_results_json_is_one_line():
    for p in RESULTS.rglob("*.json"):
        if p.stat().st_size > 500_000:
            assert p.read_text().count("\n") <= 1, f"{p.relative_to(ROOT)}: write it compact"


def test_blob_id_is_gits():
    assert vs.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git hash-object /dev/null
    assert vs.git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


@pytest.mark.skipif(not HAS_GIT, reason="needs git and a checkout")
def test_run_suite_records_the_commit_instead_of_copying_sources(tmp_path):
    doc = vs.run_suite(SMALL[:1], tmp_path, fake_measure(), reps=2, device=DEVICE)
    code = doc["code"]
    assert code["commit"] == git("rev-parse", "HEAD").strip() and isinstance(code["dirty"], bool)
    assert set(code["sources"]) == {"validation/megakernel/mk_kernel.cu", "validation/kernels/mk_ops.cuh",
                                    "validation/kernels/mk_device.cuh"}
    for path, blob in code["sources"].items():
        assert blob == git("hash-object", path).strip()
    assert not (tmp_path / "sources").exists()
    assert json.loads((tmp_path / "measured.json").read_text())["code"] == code


def test_resume_keeps_the_code_of_the_earlier_run(tmp_path):
    vs.run_suite(SMALL[:1], tmp_path, fake_measure(), reps=2, device=DEVICE)
    doc = json.loads((tmp_path / "measured.json").read_text())
    doc["code"] = {"commit": "0" * 40, "dirty": False, "sources": {}}
    (tmp_path / "measured.json").write_text(json.dumps(doc))
    new = vs.run_suite(SMALL[:2], tmp_path, fake_measure(), reps=2, device=DEVICE, resume=True)
    kept, ran = new["cases"]
    assert kept["code"]["commit"] == "0" * 40 and "code" not in ran and new["code"]["commit"] != "0" * 40


@pytest.mark.skipif(not HAS_GIT, reason="needs git and the repository's history")
def test_h200_sources_are_in_the_commit_recorded():
    doc = json.loads((RESULTS / "h200" / "sources.json").read_text())
    assert set(doc["files"]) == {"mk_kernel.cu", "mk_ops.cuh", "mk_device.cuh"}
    for entry in doc["files"].values():
        try:
            blob = git("rev-parse", f"{entry['commit']}:{entry['path']}").strip()
        except subprocess.CalledProcessError:
            pytest.skip(f"commit {entry['commit'][:7]} is not in this clone")
        assert blob == entry["blob"]


def test_index_names_every_results_folder():
    text = (RESULTS / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)/` \|", text, re.M))
    assert listed == {p.name for p in RESULTS.iterdir() if p.is_dir() and p.name != "evidence"}


def test_the_evidence_readme_has_a_section_with_commands_for_every_folder():
    """One README for the evidence folders: an index row and a section per folder, each section
    with the command of its files; no folder keeps a README or a run script of its own."""
    evidence = RESULTS / "evidence"
    text = (evidence / "README.md").read_text()
    folders = {p.name for p in evidence.iterdir() if p.is_dir()}
    assert set(re.findall(r"^\| \[`([^`]+)/`\]", text, re.M)) == folders
    sections = dict(re.findall(r"^### `([^`]+)/`\n(.*?)(?=^### `|\Z)", text, re.M | re.S))
    assert set(sections) == folders
    for name, body in sections.items():
        assert "python" in body or "bash" in body or "nvcc" in body, f"{name}: no command in its section"
        assert not list((evidence / name).glob("README.md")) and not list((evidence / name).glob("run*.sh")), name
