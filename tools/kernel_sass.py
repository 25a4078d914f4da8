#!/usr/bin/env python3
"""Static figures of the CUDA kernels, no GPU needed: registers and spills (ptxas -v) and the
instructions of each kernel's main loop in the sm_90 SASS.

    .venv/bin/python tools/kernel_sass.py [KERNEL_PREFIX ...]

The main loop is the smallest loop (backward branch) that holds the most HMMA instructions, or,
in a kernel without HMMA, the most global loads. Its instruction count per HMMA, or per load,
is what the tensor-core GEMV and the streaming kernels are tuned on here: both were measured
on an H200 as bound by instruction issue and latency, not by memory.

nvcc comes from .venv (tools/setup-venv.sh); cuobjdump and nvdisasm are installed into .venv
on first use (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm).
"""

import glob
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ["nvidia-cuda-cuobjdump==13.2.86", "nvidia-cuda-nvdisasm==13.5.37"]


def cu13_bin():
    site = sysconfig.get_paths()["purelib"]
    path = os.path.join(site, "nvidia", "cu13", "bin")
    if not os.path.exists(os.path.join(path, "nvdisasm")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *TOOLS], check=True)
    for tool in ("nvcc", "cuobjdump", "nvdisasm"):
        exe = os.path.join(path, tool)
        if not os.access(exe, os.X_OK):
            sys.exit(f"kernel_sass: no {tool} in {path} (run tools/setup-venv.sh)")
    return path


def combined_source():
    """The kernels' translation unit as kernels/build.rs writes it (a build of mmq-kernels)."""
    subprocess.run(["cargo", "build", "-q", "-p", "mmq-kernels"], cwd=ROOT, check=True)
    outs = glob.glob(os.path.join(ROOT, "target/debug/build/mmq-kernels-*/out/mmq_kernels.cu"))
    if not outs:
        sys.exit("kernel_sass: no mmq_kernels.cu under target/debug/build")
    return max(outs, key=os.path.getmtime)


def main_loop(sass):
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    index = {a: i for i, (a, _) in enumerate(ins)}
    marker = "HMMA" if any("HMMA" in t for _, t in ins) else "LDG"
    best = None
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in index:
            continue
        body = ins[index[int(m.group(1), 16)] : i + 1]
        hits = sum(marker in t for _, t in body)
        if hits and (best is None or (hits, -len(body)) > (best[1], -len(best[0]))):
            best = (body, hits)
    return best, marker


def main():
    prefixes = sys.argv[1:] or ["mmq_nbits_gemv_tc_m1", "mmq_nbits_gemv_lean_m1",
                                "mmq_nbits_gemv_lean_zp_m1", "mmq_nbits_gemv_lean_m8"]
    bin_dir = cu13_bin()
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        log = subprocess.run(
            ["nvcc", "-std=c++17", "-O3", "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", cubin,
             combined_source()], env=env, capture_output=True, text=True, check=True).stderr
        regs, cur = {}, None
        for line in log.splitlines():
            m = re.search(r"Compiling entry function '(\w+)'", line)
            if m:
                cur = m.group(1)
            m = re.search(r"(\d+) bytes spill stores", line)
            if m and cur:
                regs.setdefault(cur, {})["spill"] = int(m.group(1))
            m = re.search(r"Used (\d+) registers", line)
            if m and cur:
                regs.setdefault(cur, {})["regs"] = int(m.group(1))
        names = sorted(n for n in regs if any(n.startswith(p) for p in prefixes))
        print("| kernel | registers | spill bytes | main loop | per HMMA or load |")
        print("|---|---|---|---|---|")
        for name in names:
            sass = subprocess.run(["cuobjdump", "-sass", "-fun", name, cubin], env=env,
                                  capture_output=True, text=True, check=True).stdout
            best, marker = main_loop(sass)
            loop = "none" if best is None else f"{len(best[0])} instructions, {best[1]} {marker}"
            per = "–" if best is None else f"{len(best[0]) / best[1]:.1f}"
            r = regs[name]
            print(f"| {name} | {r.get('regs')} | {r.get('spill', 0)} | {loop} | {per} |")


if __name__ == "__main__":
    main()
