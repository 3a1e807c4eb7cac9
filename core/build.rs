//! Compiles the one piece of C in the core: the variadic logger handed to
//! plugins (stable Rust cannot define a C variadic function).
fn main() {
    println!("cargo:rerun-if-changed=src/plugin/logger.c");
    cc::Build::new()
        .file("src/plugin/logger.c")
        .warnings(true)
        .compile("oxccl_plugin_logger");
}
