"""Building and binding the kernel library (models/native/): one cache entry per source, flags and CPU, readable by
others, built once under a lock, within a timeout; the ctypes table read from csrc/kernels.h; the ISA switch."""

import ctypes
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from eagle_trt.models import native
from eagle_trt.errors import InputError
from native_support import build_names, lib_or_skip
from eagle_trt.models import isa
from eagle_trt.models.native import bindings, build

lib = native.library()
needs_lib = pytest.mark.skipif(lib is None, reason=f"no native kernels here: {native.unavailable()}")


def test_build_reports_the_compiler_error(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "compiler", lambda: None)
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler found \(set CXX, or install g\+\+\)"):
        build.build(out_dir=tmp_path)
    bogus = tmp_path / "cxx"
    bogus.write_text("#!/bin/sh\necho 'cxx: cannot build' >&2\nexit 1\n")
    bogus.chmod(0o755)
    with pytest.raises(RuntimeError, match="cannot build"):
        build.build(cxx=str(bogus), out_dir=tmp_path / "k")
    assert not list((tmp_path / "k").glob("*.so*"))  # nothing half-written left behind


def test_a_compiler_that_hangs_times_out(tmp_path, monkeypatch):
    slow = tmp_path / "cxx"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("EAGLE_TRT_BUILD_TIMEOUT", "0.5")
    with pytest.raises(RuntimeError, match=r"did not finish .* within 0 s \(EAGLE_TRT_BUILD_TIMEOUT\)"):
        build.build(cxx=str(slow), out_dir=tmp_path / "k")
    assert not list((tmp_path / "k").glob("*.so*"))


def test_two_builders_compile_once_and_share_the_result(tmp_path):
    """A lock makes the second process wait for the first one's build instead of compiling again."""
    calls = tmp_path / "calls"
    cxx = tmp_path / "cxx"
    # A fake compiler: counts its runs, takes a moment, writes an "-o" file.
    cxx.write_text(f"#!/bin/sh\necho run >> {calls}\nsleep 0.5\nfor a; do [ \"$prev\" = -o ] && : > \"$a\"; "
                   "prev=$a; done\n")
    cxx.chmod(0o755)
    out = []
    threads = [threading.Thread(target=lambda: out.append(build.build(cxx=str(cxx), out_dir=tmp_path / "k")))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 2 and out[0] == out[1] and out[0].exists()
    assert calls.read_text().count("run") == 1


def test_a_build_compiles_the_files_its_key_names(tmp_path, monkeypatch):
    """The sources are listed when a build starts, not when the module was imported: a .cpp that appeared since is
    in both the key and the compile (else a library missing it would be cached under the new sources' key)."""
    cxx = tmp_path / "cxx"
    seen = tmp_path / "seen"
    cxx.write_text(f"#!/bin/sh\necho \"$@\" >> {seen}\n"
                   "for a; do [ \"$prev\" = -o ] && : > \"$a\"; prev=$a; done\n")
    cxx.chmod(0o755)
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "a.cpp").write_text("int a;\n")
    monkeypatch.setattr(build, "CSRC", src)
    first = build.build(cxx=str(cxx), out_dir=tmp_path / "k")
    (src / "b.cpp").write_text("int b;\n")
    second = build.build(cxx=str(cxx), out_dir=tmp_path / "k")
    runs = seen.read_text().splitlines()
    assert first != second and len(runs) == 2
    assert "a.cpp" in runs[0] and "b.cpp" not in runs[0] and "a.cpp" in runs[1] and "b.cpp" in runs[1]


@needs_lib
def test_library_is_cached_per_source_and_readable_by_others(tmp_path):
    first = build.build(out_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    assert build.build(out_dir=tmp_path) == first and first.stat().st_mtime_ns == mtime
    mode = stat.S_IMODE(first.stat().st_mode)
    assert mode & 0o044 == 0o044, oct(mode)  # group and others may read (and so map) it
    other = "native" if isa.requested() == "avx2" else "avx2"
    assert build.build(out_dir=tmp_path, target_isa=other) != first  # the ISA is part of the key


def test_every_entry_point_is_declared_once_and_bound_from_the_header():
    table = bindings.signatures()
    assert table["eagle_trt_gemm"] == (ctypes.c_int, [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 2)
    assert table["eagle_trt_isa"] == (ctypes.c_int, [])
    assert table["eagle_trt_gemm_packed_size"][0] is ctypes.c_int64
    # Every extern "C" definition in the sources is declared in the header (the compiler checks the signatures).
    defined = set()
    for src in build.sources():
        text = src.read_text()
        defined |= {name for name in table if f"{name}(" in text.replace(" (", "(")}
        for line in text.splitlines():
            if line.startswith(("int eagle_trt_", "int64_t eagle_trt_")):
                assert line.split("(")[0].split()[-1] in table, line
    assert defined == set(table)


def test_header_parser_reads_pointers_and_scalars():
    text = ("// comment int eagle_trt_x(int a);\nextern \"C\" {\nint64_t eagle_trt_f(const void* const* w, int64_t n,\n"
            "    float eps, int bf16);\nvoid eagle_trt_g(void);\n}")
    table = bindings.parse_header(text)
    assert table == {"eagle_trt_f": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int]),
                     "eagle_trt_g": (None, [])}
    with pytest.raises(ValueError, match="cannot bind parameter 'double x'"):
        bindings.parse_header("int eagle_trt_h(double x);")


@needs_lib
def test_loaded_library_names_its_backend():
    assert lib.isa_name in ("amx", "avx512", "avx2")
    assert lib.gemm_packed_size(10, 3, 0) == 2 * lib.lanes() * 10  # one panel of 2 vectors


def test_isa_switch(monkeypatch):
    monkeypatch.delenv("EAGLE_TRT_ISA", raising=False)
    assert isa.requested() == "native" and isa.march_flags() == ["-march=native"]
    monkeypatch.setenv("EAGLE_TRT_ISA", "AVX2")
    assert isa.requested() == "avx2" and "-march=x86-64-v3" in isa.march_flags()
    assert isa.hides_bf16_hardware() and isa.hides_amx()
    monkeypatch.setenv("EAGLE_TRT_ISA", "avx512")  # as on a CPU that has it (an AVX2-only one refuses it)
    monkeypatch.setattr(isa, "cpu_flags", lambda: {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
    assert not isa.hides_bf16_hardware() and isa.hides_amx() and "-mno-amx-tile" in isa.march_flags()
    monkeypatch.setenv("EAGLE_TRT_ISA", "avxvnni")
    monkeypatch.setattr(isa, "cpu_flags", lambda: {"avx2", "fma", "avx_vnni"})
    assert "-mavxvnni" in isa.march_flags() and isa.hides_bf16_hardware() and isa.hides_amx()
    monkeypatch.undo()
    monkeypatch.setenv("EAGLE_TRT_ISA", "sse2")
    with pytest.raises(InputError, match=r"EAGLE_TRT_ISA='sse2': expected one of native, amx, avx512, avxvnni, avx2 \(this CPU "
                                         r"has: "):
        isa.requested()


@pytest.mark.parametrize("value, flags, message", [
    ("amx", {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"},
     "EAGLE_TRT_ISA='amx': this CPU lacks amx_tile, amx_bf16 (it has: avx512, avx2)"),
    ("avx512", {"avx2", "fma"}, "EAGLE_TRT_ISA='avx512': this CPU lacks avx512f, avx512bw, avx512vl, avx512dq "
                                "(it has: avx2)"),
    ("bogus", {"avx2", "fma"}, "EAGLE_TRT_ISA='bogus': expected one of native, amx, avx512, avxvnni, avx2 (this CPU has: avx2)"),
])
def test_an_isa_this_cpu_lacks_is_an_input_error(monkeypatch, value, flags, message):
    monkeypatch.setenv("EAGLE_TRT_ISA", value)
    monkeypatch.setattr(isa, "cpu_flags", lambda: flags)
    with pytest.raises(InputError) as info:
        isa.requested()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("value", ["bogus", "amx"])
def test_a_bad_isa_fails_run_with_exit_2_and_one_message(value, tmp_path):
    """Before: a warning that the torch reference runs instead, then `Error: ValueError`, exit 1. Now one line, exit
    2, and nothing about a fallback. (`amx` is only bad where this CPU lacks it.)"""
    if value == "amx" and "amx_tile" in isa.cpu_flags():
        pytest.skip("this CPU has AMX")
    code = "from eagle_trt.cli.app import main; main()"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_TRT_ISA")}
    env.update(EAGLE_TRT_ISA=value, EAGLE_TRT_CACHE=str(tmp_path))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"name: x\ncheckpoint_dir: {tmp_path / 'none'}\ndtype: auto\n")  # auto: asks the kernels
    proc = subprocess.run([sys.executable, "-c", code, "build", "--config", str(cfg), "--dry-run"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert f"Error: EAGLE_TRT_ISA='{value}'" in proc.stderr and "torch reference" not in proc.stderr
    assert "Traceback" not in proc.stderr


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_TRT_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


@needs_lib
def test_forced_avx2_build_runs_the_avx2_backend(tmp_path):
    out = _python("from eagle_trt.models import native; from eagle_trt.models.gemm import bf16_hardware; "
                  "print(native.library().isa_name, bf16_hardware())",
                  EAGLE_TRT_ISA="avx2", EAGLE_TRT_CACHE=str(tmp_path))
    assert out.returncode == 0 and out.stdout.split() == ["avx2", "False"], out.stderr


def test_disabled_means_the_torch_reference(tmp_path):
    code = ("import torch; from eagle_trt.models import native; from eagle_trt.models.kernels import choose_kernels; "
            ""
            "assert native.library() is None and 'EAGLE_TRT_NATIVE=0' in native.unavailable(); "
            "print(choose_kernels(torch.bfloat16, None).name)")
    out = _python(code, EAGLE_TRT_NATIVE="0", EAGLE_TRT_REQUIRE_NATIVE="1", EAGLE_TRT_CACHE=str(tmp_path))
    assert out.returncode == 0 and out.stdout.split() == ["torch"], out.stderr
    assert not (tmp_path / "kernels").exists()  # disabled: nothing compiled


def test_required_kernels_that_cannot_build_are_an_error(tmp_path):
    """EAGLE_TRT_REQUIRE_NATIVE=1 (CI): no compiler is a failure, not a fallback (nor a skipped test)."""
    code = "from eagle_trt.models import native; native.library()"
    out = _python(code, EAGLE_TRT_REQUIRE_NATIVE="1", CXX=str(Path(tmp_path) / "missing-cxx"),
                  PATH=str(tmp_path), EAGLE_TRT_CACHE=str(tmp_path))
    assert out.returncode != 0 and "EAGLE_TRT_REQUIRE_NATIVE=1 but the native kernels are unavailable: no C++ " \
        "compiler found" in out.stderr, out.stderr
    out = _python("from eagle_trt.models import native; print(native.library())", CXX=str(tmp_path / "missing"),
                  PATH=str(tmp_path), EAGLE_TRT_CACHE=str(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr


def test_the_amx_and_avx2_code_compiles_on_any_machine(tmp_path):
    """The AMX kernels (and the AVX2 ones) are compiled by a CPU that runs them only where it has them: keep both
    compiling everywhere a compiler exists, whatever this CPU (an object file, not run)."""
    cxx = build.compiler()
    if cxx is None:
        pytest.skip(f"no C++ compiler: {native.unavailable()}")
    for march in ("-march=sapphirerapids", "-march=x86-64-v3"):
        probe = subprocess.run([cxx, march, "-x", "c++", "-c", "-o", os.devnull, "-"], input="int x;",
                               capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"{cxx} does not know {march}")
        flags = [f for f in build.FLAGS if f not in ("-shared", "-Wl,-Bsymbolic")]
        for src in build.sources():
            out = subprocess.run([cxx, *flags, march, "-c", str(src), "-o", str(tmp_path / (src.stem + ".o"))],
                                 capture_output=True, text=True)
            assert out.returncode == 0, (march, src.name, out.stderr[-2000:])


@needs_lib
def test_a_library_others_can_write_is_not_loaded(tmp_path):
    """A compiled library is code the process runs: one in a cache dir others can write (EAGLE_TRT_CACHE=/tmp/x,
    say) is refused with the reason, never loaded."""
    import shutil

    out = tmp_path / "kernels"
    built = build.build(out_dir=out)
    assert built.is_file()
    os.chmod(out, 0o777)
    with pytest.raises(RuntimeError, match=r"kernel cache '.*kernels' is writable by another user .*mode 0777"):
        build.build(out_dir=out)
    os.chmod(out, 0o755)
    os.chmod(built, 0o777)
    with pytest.raises(RuntimeError, match="is writable by another user"):
        build.build(out_dir=out)
    os.chmod(built, 0o755)
    assert build.build(out_dir=out) == built
    shutil.rmtree(out)


@pytest.mark.parametrize("name", build_names())
def test_the_multiply_add_peak_of_each_build(name):
    """madd_peak times the kernels' own instructions: a positive rate for fp32 and int8 on every build, the bf16 dot
    only where the build has AVX512-BF16 (-1 elsewhere), -1 for a kind or repeat count it does not take; two threads
    report a rate of their own (each thread's best timing, summed)."""
    lib = lib_or_skip(name)
    fp32, int8 = lib.madd_peak(0, 1, 2), lib.madd_peak(2, 1, 2)
    assert fp32 > 0 and int8 > 0
    bf16 = lib.madd_peak(1, 1, 2)
    assert bf16 == -1 if name == "avx2" or "avx512_bf16" not in isa.cpu_flags() else bf16 > 0
    assert lib.madd_peak(3, 1, 2) == -1 and lib.madd_peak(-1, 1, 2) == -1 and lib.madd_peak(0, 1, 0) == -1
    assert lib.madd_peak(2, 2, 3) > 0.3 * int8  # a loose bound: a shared machine may slow either thread

