//! The renderer's wire format: a 4-byte big-endian length, then that many bytes of one JSON
//! object (`renderer/protocol.go` is the other end; docs/reconcile.md describes the messages).

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// the stream failed or ended inside a frame.
    #[error("read frame: {0}")]
    Io(#[source] std::io::Error),
    /// the length header announces more than the reader accepts.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The announced length.
        len: usize,
        /// The most the reader accepts.
        max: usize,
    },
    /// the body is not the expected JSON.
    #[error("decode frame: {0}")]
    Json(#[source] serde_json::Error),
}

/// A frame holding `value` as JSON.
pub fn encode(value: &impl Serialize) -> Vec<u8> {
    let body = serde_json::to_vec(value).expect("the protocol's types serialize");
    let len = u32::try_from(body.len()).expect("a frame fits in 4 GiB");
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Reads one frame of at most `max` body bytes and decodes it; `None` on a clean end of stream
/// (before any byte of a frame).
pub async fn read<T, R>(reader: &mut R, max: usize) -> Result<Option<T>, FrameError>
where
    T: for<'de> Deserialize<'de>,
    R: AsyncRead + Unpin,
{
    let mut header = [0u8; 4];
    let mut filled = 0;
    while filled < header.len() {
        match reader.read(&mut header[filled..]).await {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => {
                return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            Ok(n) => filled += n,
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await.map_err(FrameError::Io)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(FrameError::Json)
}

/// The renderer's first frame.
#[derive(Debug, Deserialize)]
pub struct Hello {
    /// Versions the renderer was built with.
    pub hello: HelloBody,
}

/// What the hello frame says.
#[derive(Debug, Deserialize)]
pub struct HelloBody {
    /// The `helm.sh/helm/v4` module version, e.g. `v4.3.2`.
    pub helm: String,
    /// The Go toolchain.
    pub go: String,
}

/// One `helm template` call: the same inputs as its flags.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    /// Matches the response.
    pub id: u64,
    /// The chart's path.
    pub chart: &'a str,
    /// The release name.
    pub release: &'a str,
    /// `--namespace`.
    pub namespace: &'a str,
    /// The values document (JSON, read as YAML like `--values -`).
    pub values: &'a str,
    /// `--kube-version`.
    pub kube_version: &'a str,
    /// `--api-versions`, each value as the flag takes it (comma lists allowed).
    pub api_versions: &'a [String],
    /// `--is-upgrade`.
    pub is_upgrade: bool,
    /// `--include-crds`.
    pub include_crds: bool,
    /// `--skip-tests`.
    pub skip_tests: bool,
    /// Most bytes of output; more is an `outputTooLarge` failure.
    pub max_output: usize,
}

/// The answer to one request: a manifest or an error.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct Response {
    /// The request's id.
    pub id: u64,
    /// The rendered output, as `helm template` prints it.
    pub manifest: Option<String>,
    /// Why the render failed.
    pub error: Option<Failure>,
}

/// A failed render. The renderer caps the text (`maxMessage` in `renderer/main.go`): a longer
/// one comes as its start (`message`), the count of bytes left out and its end (`tail`).
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct Failure {
    /// `helm` (the message is what helm prints after `Error: `), `outputTooLarge` or `panic`.
    pub kind: String,
    /// What went wrong (its start, when `omitted` is not 0).
    pub message: String,
    /// Bytes of the text left out between `message` and `tail`.
    #[serde(default)]
    pub omitted: usize,
    /// The end of a text cut in the middle.
    #[serde(default)]
    pub tail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_end_cleanly() {
        let mut stream = encode(&serde_json::json!({"id": 7, "manifest": "a: <b> & \"c\""}));
        stream.extend(encode(
            &serde_json::json!({"id": 8, "error": {"kind": "helm", "message": "x"}}),
        ));
        let mut reader = stream.as_slice();
        let first: Response = read(&mut reader, 1024).await.unwrap().unwrap();
        assert_eq!(first.id, 7);
        assert_eq!(first.manifest.as_deref(), Some("a: <b> & \"c\""));
        let second: Response = read(&mut reader, 1024).await.unwrap().unwrap();
        assert_eq!(second.error.unwrap().kind, "helm");
        assert!(
            read::<Response, _>(&mut reader, 1024)
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_cut_or_oversized_frame_is_an_error() {
        let frame = encode(&serde_json::json!({"id": 1}));
        for cut in [1, 3, 5, frame.len() - 1] {
            let mut reader = &frame[..cut];
            let error = read::<Response, _>(&mut reader, 1024).await.unwrap_err();
            assert!(matches!(error, FrameError::Io(_)), "cut at {cut}: {error}");
        }
        let mut reader = frame.as_slice();
        let error = read::<Response, _>(&mut reader, 3).await.unwrap_err();
        assert!(
            matches!(error, FrameError::TooLarge { len: 8, max: 3 }),
            "{error}"
        );
        let mut garbage = 2u32.to_be_bytes().to_vec();
        garbage.extend(b"{{");
        let error = read::<Response, _>(&mut garbage.as_slice(), 1024)
            .await
            .unwrap_err();
        assert!(matches!(error, FrameError::Json(_)), "{error}");
    }

    #[test]
    fn a_request_is_the_json_the_renderer_reads() {
        let apis = vec!["v1".to_owned(), "apps/v1,batch/v1".to_owned()];
        let frame = encode(&Request {
            id: 3,
            chart: "/c",
            release: "r",
            namespace: "n",
            values: "{}",
            kube_version: "v1.36.3",
            api_versions: &apis,
            is_upgrade: true,
            include_crds: true,
            skip_tests: true,
            max_output: 10,
        });
        assert_eq!(
            u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
        let body: serde_json::Value = serde_json::from_slice(&frame[4..]).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"id": 3, "chart": "/c", "release": "r", "namespace": "n",
                "values": "{}", "kubeVersion": "v1.36.3", "apiVersions": ["v1", "apps/v1,batch/v1"],
                "isUpgrade": true, "includeCrds": true, "skipTests": true, "maxOutput": 10})
        );
    }
}
