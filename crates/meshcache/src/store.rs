//! `meshcache store check DIR [--repair]`: the offline check of a disk store's directory.

use std::path::PathBuf;

/// Disk store tools.
#[derive(clap::Subcommand)]
pub enum StoreCommand {
    /// Verify a disk store's directory (the node must not be running on it): objects, bytes,
    /// damaged and superseded records, unfinished writes.
    Check {
        /// The directory (a `[[store.disk]]` path).
        dir: PathBuf,
        /// Remove what a node would ignore: damaged and superseded records, unfinished writes.
        #[arg(long)]
        repair: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the command. A check that finds damage without `--repair` exits with an error, so
/// scripts notice.
pub fn run(command: StoreCommand) -> anyhow::Result<()> {
    let StoreCommand::Check { dir, repair, json } = command;
    let report = meshcache_disk::check(&dir, repair)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}: disk store", dir.display());
        println!("{report}");
    }
    if !repair && report.damaged > 0 {
        anyhow::bail!(
            "{} damaged record(s) in {} (a node drops them when it starts; --repair removes them now)",
            report.damaged,
            dir.display()
        );
    }
    Ok(())
}
