//! Builds what the CUDA layer embeds and what the CPU checks compile:
//!
//! 1. `OUT_DIR/mmq_kernels.cu`: every `cuda/*.cu` with the local headers inlined (with `#line`
//!    directives, so diagnostics name the real file), one translation unit that nvcc and NVRTC
//!    compile alike.
//! 2. `OUT_DIR/mmq_kernels.fatbin`: that unit compiled by nvcc (warnings as errors; SASS for
//!    sm_80, sm_89 and sm_90 and compute_90 PTX). nvcc is `$MMQ_NVCC`, else `nvcc` on `PATH`, in
//!    `$CUDA_HOME/bin` or in the repository's `.venv` (the pip package `nvidia-cuda-nvcc`). Without nvcc the file is empty and the kernels are compiled at run time by
//!    NVRTC from the embedded source; with `MMQ_NVCC` set, a failed compile fails the build.
//! 3. The element math and kernel bodies (`cuda/*.cuh`) compiled for the host (`host_check.cpp`,
//!    through the `cc` crate), compared bit for bit with the Rust reference by the tests. Without a
//!    C++ compiler the build still succeeds; that test then fails and says why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

/// The translation units, in order; headers come in through their `#include "…"` lines.
const UNITS: [&str; 3] = ["quantize.cu", "nbits.cu", "cache.cu"];
/// The architectures with SASS in the fatbin; the last also gets PTX.
const ARCHS: [&str; 3] = ["80", "89", "90"];

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for entry in fs::read_dir("cuda").expect("kernels/cuda exists").flatten() {
        println!("cargo::rerun-if-changed={}", entry.path().display());
    }
    println!("cargo::rerun-if-env-changed=MMQ_NVCC");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");
    println!("cargo::rustc-check-cfg=cfg(mmq_host_cuh)");
    println!("cargo::rustc-check-cfg=cfg(mmq_emu)");

    let source = combined_source();
    let cu = out.join("mmq_kernels.cu");
    fs::write(&cu, &source).expect("write the combined CUDA source");
    let fatbin = out.join("mmq_kernels.fatbin");
    let built = build_fatbin(&cu, &fatbin);
    let archs: Vec<String> = match &built {
        Some(_) => ARCHS.iter().map(|a| format!("\"sm_{a}\"")).collect(),
        None => Vec::new(),
    };
    fs::write(
        out.join("cuda_build.rs"),
        format!(
            "/// The nvcc that built [`FATBIN`] (its `--version` last line); `None`: no fatbin.\n\
             pub const NVCC: Option<&str> = {};\n\
             /// The SASS architectures in [`FATBIN`] (compute_90 PTX comes with them).\n\
             pub const FATBIN_ARCHS: &[&str] = &[{}];\n",
            match &built {
                Some(v) => format!("Some({v:?})"),
                None => "None".into(),
            },
            archs.join(", ")
        ),
    )
    .expect("write cuda_build.rs");

    let host = cc::Build::new()
        .cpp(true)
        .cpp_link_stdlib(None)
        .file("cuda/host_check.cpp")
        .include("cuda")
        .flag_if_supported("-std=c++20")
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-ffp-contract=off")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .opt_level(2)
        .try_compile("mmq_host_check");
    match host {
        Ok(()) => println!("cargo::rustc-cfg=mmq_host_cuh"),
        Err(e) => println!("cargo::warning=kernels/cuda not compiled for the host checks: {e}"),
    }
    match emulator(&out) {
        Ok(()) => println!("cargo::rustc-cfg=mmq_emu"),
        Err(e) => println!("cargo::warning=kernels/cuda not compiled for the CPU emulator: {e}"),
    }
}

/// The CPU emulator (`cuda/emu.h`): the combined source compiled as C++ with the emulator's
/// prelude, a table of its kernels, and the fiber runtime.
fn emulator(out: &Path) -> Result<(), String> {
    let build = || {
        let mut b = cc::Build::new();
        b.cpp(true)
            .include("cuda")
            .include(out)
            .flag_if_supported("-std=c++17")
            .flag_if_supported("-fno-fast-math")
            .flag_if_supported("-ffp-contract=off")
            .flag_if_supported("-fno-strict-aliasing")
            .flag_if_supported("-Wno-unknown-pragmas")
            .warnings(true)
            .extra_warnings(true)
            .warnings_into_errors(true)
            .opt_level(2);
        b
    };
    // The kernels' names, from the preprocessed source (they come out of macros).
    let expanded = build()
        .file("cuda/emu_kernels.cpp")
        .define("MMQ_EMU_SCAN", None)
        .try_expand()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&expanded);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut table = String::new();
    for (i, _) in flat.match_indices("extern \"C\" void ") {
        let rest = &flat[i + "extern \"C\" void ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.starts_with("mmq_") && rest[name.len()..].trim_start().starts_with('(') {
            table.push_str(&format!("MMQ_EMU_KERNEL({name})\n"));
        }
    }
    if table.is_empty() {
        return Err("no kernels found in the preprocessed source".into());
    }
    fs::write(out.join("mmq_emu_kernels.inc"), table).map_err(|e| e.to_string())?;
    build()
        .file("cuda/emu_kernels.cpp")
        .file("cuda/emu.cpp")
        .try_compile("mmq_emu")
        .map_err(|e| e.to_string())
}

/// The units with their local headers inlined once each.
fn combined_source() -> String {
    let mut seen = Vec::new();
    let mut out =
        String::from("// Generated by kernels/build.rs from kernels/cuda; do not edit.\n");
    for unit in UNITS {
        inline(Path::new("cuda"), unit, &mut seen, &mut out);
    }
    out
}

fn inline(dir: &Path, name: &str, seen: &mut Vec<String>, out: &mut String) {
    if seen.iter().any(|s| s == name) {
        return;
    }
    seen.push(name.to_string());
    let path = dir.join(name);
    let text =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    out.push_str(&format!("#line 1 \"kernels/cuda/{name}\"\n"));
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed == "#pragma once" {
            out.push('\n');
        } else if let Some(inc) = trimmed
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'))
        {
            inline(dir, inc, seen, out);
            out.push_str(&format!("#line {} \"kernels/cuda/{name}\"\n", i + 2));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
}

/// The nvcc to use: `$MMQ_NVCC` (required to work), else one found on `PATH` or in `$CUDA_HOME`.
fn find_nvcc() -> Option<(PathBuf, bool)> {
    if let Some(p) = env::var_os("MMQ_NVCC").filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(p), true));
    }
    let mut candidates: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).map(|d| d.join("nvcc")).collect())
        .unwrap_or_default();
    if let Some(home) = env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("bin/nvcc"));
    }
    // The pip-installed nvcc of the repository's test environment (tools/setup-venv.sh).
    if let Ok(lib) = fs::read_dir("../.venv/lib") {
        for py in lib.flatten() {
            candidates.push(py.path().join("site-packages/nvidia/cu13/bin/nvcc"));
        }
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .map(|p| (p, false))
}

/// Compiles `cu` into `fatbin`; returns nvcc's version line, or `None` (and an empty file) when
/// there is no nvcc. Panics (failing the build) when a required nvcc fails.
fn build_fatbin(cu: &Path, fatbin: &Path) -> Option<String> {
    let empty = || {
        fs::write(fatbin, []).expect("write the empty fatbin");
        None
    };
    let Some((nvcc, required)) = find_nvcc() else {
        println!(
            "cargo::warning=nvcc not found (set MMQ_NVCC): the CUDA kernels will be compiled at \
             run time by NVRTC"
        );
        return empty();
    };
    let version = Command::new(&nvcc).arg("--version").output();
    let version = match version {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string(),
        other => {
            let why = format!("{} --version failed: {other:?}", nvcc.display());
            if required {
                panic!("MMQ_NVCC: {why}");
            }
            println!("cargo::warning={why}; the CUDA kernels will be compiled by NVRTC");
            return empty();
        }
    };
    let mut cmd = Command::new(&nvcc);
    cmd.args(["-std=c++17", "--fatbin", "-O3", "--threads", "0"])
        .args(["--Werror", "all-warnings"])
        .args(["-Xptxas", "-warn-spills"]);
    for (i, arch) in ARCHS.iter().enumerate() {
        let code = if i + 1 == ARCHS.len() {
            format!("[sm_{arch},compute_{arch}]")
        } else {
            format!("sm_{arch}")
        };
        cmd.arg("-gencode")
            .arg(format!("arch=compute_{arch},code={code}"));
    }
    cmd.arg("-o").arg(fatbin).arg(cu);
    match cmd.output() {
        Ok(o) if o.status.success() => Some(version),
        Ok(o) => {
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            if required {
                panic!("nvcc failed on kernels/cuda:\n{log}");
            }
            for line in log.lines() {
                println!("cargo::warning=nvcc: {line}");
            }
            empty()
        }
        Err(e) => {
            if required {
                panic!("cannot run {}: {e}", nvcc.display());
            }
            println!("cargo::warning=cannot run {}: {e}", nvcc.display());
            empty()
        }
    }
}
