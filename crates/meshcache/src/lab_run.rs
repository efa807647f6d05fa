//! (being written)

/// Arguments.
#[derive(clap::Args)]
pub struct RunArgs {}

/// Runs the command.
pub fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
