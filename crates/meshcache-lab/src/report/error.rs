//! What can go wrong while writing a report.

use std::path::PathBuf;

/// What can go wrong while writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Creating the output directory or writing one of its files failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Serialising the results to JSON failed.
    #[error("cannot serialise the results to JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Rendering a PNG failed (the SVG of the same graph may have been written).
    #[error("cannot render {path}: {message}")]
    Render {
        /// The PNG file.
        path: PathBuf,
        /// What plotters reported.
        message: String,
    },
}
