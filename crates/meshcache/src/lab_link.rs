//! (being written)

/// Arguments.
#[derive(clap::Args)]
pub struct LinkArgs {}

/// Runs the command.
pub fn run(_args: LinkArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
