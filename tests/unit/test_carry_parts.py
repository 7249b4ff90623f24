"""scripts/device/carry-parts.sh: files split into parts here come back whole there, one part a call,
and parts that do not add up are refused."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device" / "carry-parts.sh"


def sh(*args, cwd, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env})


def call_with(part: Path, here: Path, there: Path) -> Path:
    """A device call: a fresh copy of the tree carrying one part and the two small files."""
    tree = there / f"call-{part.name}"
    (tree / ".devcarry" / "blob").mkdir(parents=True)
    for f in (part, here / ".devcarry/blob/SHA256", here / ".devcarry/blob/COUNT"):
        (tree / ".devcarry/blob" / f.name).write_bytes(f.read_bytes())
    return tree


def test_parts_come_back_whole_one_call_each(tmp_path):
    here, there, dest = tmp_path / "here", tmp_path / "there", tmp_path / "dest"
    (here / ".git/info").mkdir(parents=True)
    (here / "data").mkdir()
    blob = os.urandom(2500)
    (here / "data" / "weights.bin").write_bytes(blob)
    packed = sh("pack", "blob", str(here / "data"), cwd=here, CARRY_PART_BYTES="4000")
    assert packed.returncode == 0, packed.stderr
    parts = sorted((here / ".devcarry/blob").glob("part*"))
    assert len(parts) == 3 and (here / ".devcarry/blob/COUNT").read_text().strip() == "3"  # one 10240 B tar record
    assert "/.devcarry/" in (here / ".git/info/exclude").read_text()  # never committed
    stores = {"CARRY_STORE": str(tmp_path / "store")}
    said = [sh("join", "blob", str(dest), cwd=call_with(p, here, there), **stores).stdout.strip() for p in parts]
    assert said[:-1] == [f"blob: {i} of 3 parts so far" for i in (1, 2)]
    assert said[-1] == f"blob: unpacked into {dest}"
    assert (dest / "data" / "weights.bin").read_bytes() == blob
    # a part changed on the way: refused, nothing unpacked over it
    (tmp_path / "store/blob/part01").write_bytes(b"x" * 4000)
    bad = sh("join", "blob", str(tmp_path / "dest2"), cwd=call_with(parts[0], here, there / "again"), **stores)
    assert bad.returncode == 1 and "do not add up" in bad.stderr and not (tmp_path / "dest2").exists()


def test_a_folder_of_links_travels_as_the_files_they_point_to(tmp_path):
    """pack.sh stages the lead's kit as a folder of links: the parts must hold the bytes, since
    the links' targets stay behind on this machine."""
    here, there, kit = tmp_path / "here", tmp_path / "there", tmp_path / "kit"
    (here / ".git/info").mkdir(parents=True)
    kit.mkdir()
    blob = os.urandom(3000)
    (kit / "p0").write_bytes(blob)
    staged = here / ".devcarry/src/.device-kit"
    staged.mkdir(parents=True)
    (staged / "p0").symlink_to(kit / "p0")
    assert sh("pack", "blob", str(staged), cwd=here).returncode == 0
    (kit / "p0").unlink()  # what the links point to is not on the device
    [part] = sorted((here / ".devcarry/blob").glob("part*"))
    said = sh("join", "blob", str(tmp_path / "dest"), cwd=call_with(part, here, there), CARRY_STORE=str(tmp_path / "store"))
    assert said.returncode == 0, said.stderr
    got = tmp_path / "dest/.device-kit/p0"
    assert not got.is_symlink() and got.read_bytes() == blob
