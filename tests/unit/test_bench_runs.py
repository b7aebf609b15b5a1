"""A bench's finished runs keep their records and lose their weights (`drop_weights`)."""

from __future__ import annotations

from pathlib import Path

from llamarl.bench.async_vs_sync import WEIGHTS, drop_weights


def test_a_finished_runs_weights_go_and_its_records_stay(tmp_path: Path) -> None:
    run_dir = tmp_path / "async-0"
    for name in WEIGHTS:
        (run_dir / name / "sub").mkdir(parents=True)
        (run_dir / name / "sub" / "model.safetensors").write_bytes(b"\0" * 64)
    records = ["metrics.jsonl", "summary.json", "timers/trainer.json", "logs/trainer.log", "layout.json"]
    for record in records:
        (run_dir / record).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / record).write_text("{}\n")

    drop_weights(run_dir)

    assert sorted(p.name for p in run_dir.iterdir()) == sorted({Path(r).parts[0] for r in records})
    assert all((run_dir / record).read_text() == "{}\n" for record in records)


def test_a_run_without_weights_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    drop_weights(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
