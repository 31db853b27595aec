//! Build script: where `hack/build-tools.sh` caches the renderer and helm of this checkout, so
//! that `module-manager diff` run from it finds them with no flag (`src/cli/locate.rs`). Sets
//! `MODULE_MANAGER_HELM_VERSION` (`hack/versions.env`) and `MODULE_MANAGER_RENDERER_KEY` (the
//! renderer's cache key over its sources, `testenv/src/renderer_key.rs`); each is empty when
//! its file cannot be read, and `diff` then does not look there.

use std::path::Path;

#[path = "testenv/src/renderer_key.rs"]
mod renderer_key;

fn main() {
    for watched in [
        "renderer",
        "hack/versions.env",
        "testenv/src/renderer_key.rs",
    ] {
        println!("cargo:rerun-if-changed={watched}");
    }
    let versions = std::fs::read_to_string("hack/versions.env").unwrap_or_default();
    let helm = renderer_key::pinned(&versions, "HELM_VERSION").unwrap_or_default();
    let key = match helm {
        "" => String::new(),
        helm => renderer_key::renderer_key(Path::new("renderer"), helm).unwrap_or_default(),
    };
    println!("cargo:rustc-env=MODULE_MANAGER_HELM_VERSION={helm}");
    println!("cargo:rustc-env=MODULE_MANAGER_RENDERER_KEY={key}");
}
