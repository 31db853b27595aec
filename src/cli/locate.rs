//! Which renderer (or helm) `diff` runs: a path the flags (or their environment variables) name
//! wins; otherwise the first that exists of the renderer beside this executable (the image and a
//! release ship it there), the renderer `hack/build-tools.sh` built for this checkout (in its
//! cache, `$MODULE_MANAGER_CACHE` or `~/.cache/module-manager`), the renderer on `PATH`, then
//! helm in the same places. [`choose`] is pure; [`Places::of_this_process`] and [`exists`] are
//! the I/O.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::render::Backend;

/// The renderer binary's name.
pub const RENDERER_NAME: &str = "module-manager-renderer";
/// The helm binary's name.
const HELM_NAME: &str = "helm";
/// The renderer's cache key of this build's `renderer/` (`build.rs`; empty: unknown).
const RENDERER_KEY: &str = env!("MODULE_MANAGER_RENDERER_KEY");
/// The helm version `hack/versions.env` pins (`build.rs`; empty: unknown).
const HELM_VERSION: &str = env!("MODULE_MANAGER_HELM_VERSION");

/// What renders, as `--render-backend` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// The renderer child (`--renderer`).
    Renderer,
    /// `helm template` (`--helm`).
    Helm,
}

/// What the caller asked for: a backend, a renderer, a helm (each `None` when not given).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// `--render-backend`.
    pub kind: Option<Kind>,
    /// `--renderer`.
    pub renderer: Option<PathBuf>,
    /// `--helm`.
    pub helm: Option<PathBuf>,
}

/// The places looked in, as this process sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Places {
    /// The running executable's directory.
    pub beside: Option<PathBuf>,
    /// The `tools/` directory of `hack/build-tools.sh`'s cache.
    pub build_cache: Option<PathBuf>,
    /// The directories of `PATH`.
    pub path: Vec<PathBuf>,
}

/// Which place a candidate is in (for the error that lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Beside the running executable.
    Beside,
    /// Where `hack/build-tools.sh` put it.
    BuildCache,
    /// A directory of `PATH`.
    Path,
}

/// One binary that may render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The backend it would be.
    pub backend: Backend,
    /// Where it is.
    pub place: Place,
}

/// None of the candidates exists: the places tried, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotFound(pub Vec<Candidate>);

impl Places {
    /// The executable's directory, the build's cache (`$MODULE_MANAGER_CACHE/tools`, else
    /// `$HOME/.cache/module-manager/tools`) and `PATH` of this process.
    pub fn of_this_process() -> Self {
        let cache = std::env::var_os("MODULE_MANAGER_CACHE")
            .map(PathBuf::from)
            .or_else(|| Some(Path::new(&std::env::var_os("HOME")?).join(".cache/module-manager")));
        Self {
            beside: std::env::current_exe()
                .ok()
                .and_then(|exe| Some(exe.parent()?.to_owned())),
            build_cache: cache.map(|c| c.join("tools")),
            path: std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect(),
        }
    }
}

/// Whether `path` is a file (the I/O of [`choose`]).
pub fn exists(path: &Path) -> bool {
    path.is_file()
}

/// The directory of the build's cache named `prefix` and `id`; none when `id` is unknown.
fn cache_dir(prefix: &str, id: &str) -> Option<String> {
    (!id.is_empty()).then(|| format!("{prefix}{id}"))
}

/// The binaries of `kind` in `places`, in the order they are tried.
pub fn candidates(kind: Kind, places: &Places) -> Vec<Candidate> {
    let (name, cached) = match kind {
        Kind::Renderer => (RENDERER_NAME, cache_dir("renderer-", RENDERER_KEY)),
        Kind::Helm => (HELM_NAME, cache_dir("helm-v", HELM_VERSION)),
    };
    let beside = places
        .beside
        .iter()
        .map(|dir| (dir.join(name), Place::Beside));
    let cache = (places.build_cache.iter().zip(&cached))
        .map(|(tools, dir)| (tools.join(dir).join(name), Place::BuildCache));
    let path = places.path.iter().map(|dir| (dir.join(name), Place::Path));
    let backend = |path: PathBuf| match kind {
        Kind::Renderer => Backend::Renderer(path),
        Kind::Helm => Backend::Helm(path),
    };
    beside
        .chain(cache)
        .chain(path)
        .map(|(path, place)| Candidate {
            backend: backend(path),
            place,
        })
        .collect()
}

/// The backend to render with: a path the caller named (`--renderer` first, unless
/// `--render-backend helm`), else the first of the candidates (the renderer's, then helm's,
/// unless `--render-backend` names one) that `exists`.
pub fn choose(
    wanted: &Wanted,
    places: &Places,
    exists: impl Fn(&Path) -> bool,
) -> Result<Backend, NotFound> {
    let renderer = wanted.renderer.clone().map(Backend::Renderer);
    let helm = wanted.helm.clone().map(Backend::Helm);
    let (named, kinds) = match wanted.kind {
        Some(Kind::Renderer) => (renderer, vec![Kind::Renderer]),
        Some(Kind::Helm) => (helm, vec![Kind::Helm]),
        None => (renderer.or(helm), vec![Kind::Renderer, Kind::Helm]),
    };
    if let Some(named) = named {
        return Ok(named);
    }
    let tried: Vec<Candidate> = kinds
        .into_iter()
        .flat_map(|k| candidates(k, places))
        .collect();
    match tried.iter().find(|c| exists(binary(&c.backend))) {
        Some(found) => Ok(found.backend.clone()),
        None => Err(NotFound(tried)),
    }
}

/// The binary `backend` runs.
pub fn binary(backend: &Backend) -> &Path {
    match backend {
        Backend::Renderer(path) | Backend::Helm(path) => path,
    }
}

impl fmt::Display for NotFound {
    /// The places tried, a line each (`PATH` once per binary name), and the fixes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let helm = |c: &Candidate| matches!(c.backend, Backend::Helm(_));
        let what = match (self.0.iter().any(|c| !helm(c)), self.0.iter().any(helm)) {
            (true, true) => "renderer or helm",
            (false, true) => "helm",
            _ => "renderer",
        };
        write!(f, "no {what} found; tried:")?;
        let mut named_on_path = Vec::new();
        for candidate in &self.0 {
            let path = binary(&candidate.backend);
            match candidate.place {
                Place::Beside => write!(f, "\n  {} (beside this executable)", path.display())?,
                Place::BuildCache => write!(
                    f,
                    "\n  {} (where hack/build-tools.sh builds it)",
                    path.display()
                )?,
                Place::Path => {
                    let name = path.file_name().unwrap_or_default().to_owned();
                    if !named_on_path.contains(&name) {
                        write!(f, "\n  {} on PATH", name.display())?;
                        named_on_path.push(name);
                    }
                }
            }
        }
        write!(
            f,
            "\nbuild them with `make tools` (hack/build-tools.sh) in the checkout, or name one with \
             --renderer PATH or --helm PATH (MODULE_MANAGER_RENDERER, MODULE_MANAGER_HELM)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places() -> Places {
        Places {
            beside: Some("/opt/mm".into()),
            build_cache: Some("/home/u/.cache/module-manager/tools".into()),
            path: vec!["/usr/local/bin".into(), "/usr/bin".into()],
        }
    }

    fn cached_renderer() -> PathBuf {
        format!("/home/u/.cache/module-manager/tools/renderer-{RENDERER_KEY}/{RENDERER_NAME}")
            .into()
    }

    /// `choose` where exactly `present` exist.
    fn chosen(wanted: &Wanted, present: &[&str]) -> Result<Backend, NotFound> {
        choose(wanted, &places(), |p| {
            present.iter().any(|q| Path::new(q) == p)
        })
    }

    #[test]
    fn the_build_knows_where_its_renderer_and_helm_are_cached() {
        assert_eq!(RENDERER_KEY.len(), 16, "{RENDERER_KEY:?}");
        assert!(HELM_VERSION.starts_with("4."), "{HELM_VERSION:?}");
    }

    #[test]
    fn a_renderer_is_looked_for_beside_then_in_the_build_cache_then_on_path_then_helm() {
        let renderer = |p: &str| Ok(Backend::Renderer(p.into()));
        let all = [
            "/opt/mm/module-manager-renderer",
            "/usr/bin/module-manager-renderer",
        ];
        assert_eq!(chosen(&Wanted::default(), &all), renderer(all[0]));
        let cached = cached_renderer();
        let present = [cached.to_str().unwrap(), all[1], "/usr/bin/helm"];
        assert_eq!(
            chosen(&Wanted::default(), &present),
            Ok(Backend::Renderer(cached.clone()))
        );
        assert_eq!(chosen(&Wanted::default(), &present[1..]), renderer(all[1]));
        let helm_cached = format!("/home/u/.cache/module-manager/tools/helm-v{HELM_VERSION}/helm");
        assert_eq!(
            chosen(&Wanted::default(), &[&helm_cached, "/usr/bin/helm"]),
            Ok(Backend::Helm(helm_cached.clone().into()))
        );
        assert_eq!(
            chosen(&Wanted::default(), &["/usr/bin/helm"]),
            Ok(Backend::Helm("/usr/bin/helm".into()))
        );
    }

    #[test]
    fn a_named_binary_or_backend_wins() {
        let cached = cached_renderer();
        let present = [cached.to_str().unwrap(), "/usr/bin/helm"];
        let wanted = |kind, renderer: Option<&str>, helm: Option<&str>| Wanted {
            kind,
            renderer: renderer.map(PathBuf::from),
            helm: helm.map(PathBuf::from),
        };
        // A named path is taken as it is (a missing one fails when it is started).
        let named = wanted(None, Some("/x/r"), Some("/x/helm"));
        assert_eq!(
            chosen(&named, &present),
            Ok(Backend::Renderer("/x/r".into()))
        );
        let helm = wanted(None, None, Some("/x/helm"));
        assert_eq!(chosen(&helm, &present), Ok(Backend::Helm("/x/helm".into())));
        let helm = wanted(Some(Kind::Helm), Some("/x/r"), None);
        assert_eq!(
            chosen(&helm, &present),
            Ok(Backend::Helm("/usr/bin/helm".into()))
        );
        // --render-backend renderer never falls back to helm.
        let renderer = wanted(Some(Kind::Renderer), None, Some("/x/helm"));
        let Err(NotFound(tried)) = chosen(&renderer, &["/usr/bin/helm"]) else {
            panic!("a renderer found")
        };
        assert!(
            tried
                .iter()
                .all(|c| matches!(c.backend, Backend::Renderer(_)))
        );
    }

    #[test]
    fn nothing_found_lists_every_place_tried_and_the_fixes() {
        let error = chosen(&Wanted::default(), &[]).unwrap_err().to_string();
        let expected = format!(
            "no renderer or helm found; tried:\n  \
             /opt/mm/module-manager-renderer (beside this executable)\n  \
             {} (where hack/build-tools.sh builds it)\n  \
             module-manager-renderer on PATH\n  \
             /opt/mm/helm (beside this executable)\n  \
             /home/u/.cache/module-manager/tools/helm-v{HELM_VERSION}/helm (where hack/build-tools.sh builds it)\n  \
             helm on PATH\n\
             build them with `make tools` (hack/build-tools.sh) in the checkout, or name one with \
             --renderer PATH or --helm PATH (MODULE_MANAGER_RENDERER, MODULE_MANAGER_HELM)",
            cached_renderer().display()
        );
        assert_eq!(error, expected);
    }
}
