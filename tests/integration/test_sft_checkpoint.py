"""`llamarl sft` writes a checkpoint that plain transformers loads and generates from."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PLAIN_LOAD = textwrap.dedent(
    """
    import sys
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], local_files_only=True)
    ids = tok("12+34=", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    print("GENERATED", out.shape[1] - ids.shape[1], repr(tok.decode(out[0, ids.shape[1]:])))
    """
)


def test_sft_checkpoint_loads_with_plain_transformers(tmp_path: Path) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"run_dir: {tmp_path / 'run'}\n"
        "model: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}\n"
        "trainer: {sft_steps: 3, sft_batch_size: 8}\n"
    )
    out = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "sft", str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    loaded = subprocess.run(
        [sys.executable, "-c", PLAIN_LOAD, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "GENERATED" in loaded.stdout
    assert int(loaded.stdout.split()[1]) >= 1
