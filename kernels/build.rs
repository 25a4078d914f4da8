//! Compiles the element math of the CUDA kernels (`cuda/mmq_quant.cuh`) for the host, so the
//! tests compare it bit for bit with the Rust reference. Without a C++ compiler the build still
//! succeeds; the comparison test then fails and says why.

fn main() {
    println!("cargo::rerun-if-changed=cuda/mmq_quant.cuh");
    println!("cargo::rerun-if-changed=cuda/host_check.cpp");
    println!("cargo::rustc-check-cfg=cfg(mmq_host_cuh)");
    let built = cc::Build::new()
        .cpp(true)
        .cpp_link_stdlib(None)
        .file("cuda/host_check.cpp")
        .include("cuda")
        .flag_if_supported("-std=c++14")
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-ffp-contract=off")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .opt_level(2)
        .try_compile("mmq_host_check");
    match built {
        Ok(()) => println!("cargo::rustc-cfg=mmq_host_cuh"),
        Err(e) => println!("cargo::warning=kernels/cuda not compiled for the host checks: {e}"),
    }
}
