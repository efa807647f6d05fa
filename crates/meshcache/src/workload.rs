//! (being written)

/// Workload commands.
#[derive(clap::Subcommand)]
pub enum WorkloadCommand {}

/// Runs the command.
pub fn run(command: WorkloadCommand) -> anyhow::Result<()> {
    match command {}
}
