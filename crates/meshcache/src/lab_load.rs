//! (being written)

/// Arguments.
#[derive(clap::Args)]
pub struct LoadArgs {}

/// Runs the command.
pub fn run(_args: LoadArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
