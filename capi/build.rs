//! Gives the library the SONAME of NCCL's, so that a program linked
//! against NCCL (DT_NEEDED libnccl.so.2) runs on oxccl when this library is
//! found first on the library path.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
}
