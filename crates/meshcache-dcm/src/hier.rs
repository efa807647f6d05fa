//! Squid's hierarchy codes: how the access log tells where a response came from.

/// Where a request was sent (Squid's `%Sh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HierCode {
    /// Nothing was forwarded.
    None,
    /// Straight to the origin.
    Direct,
    /// A sibling answered HIT.
    SiblingHit,
    /// A parent answered HIT.
    ParentHit,
    /// A sibling's cache digest (summary) said it holds the object.
    CdSiblingHit,
    /// A parent's cache digest (summary) said it holds the object.
    CdParentHit,
    /// The parent whose MISS came first (weighted).
    FirstParentMiss,
    /// The parent reporting the smallest RTT to the origin.
    ClosestParentMiss,
    /// The only parent that can take the request; it was not queried.
    SingleParent,
    /// The first parent that is up, in configuration order.
    FirstUpParent,
    /// The parent marked `default`.
    DefaultParent,
    /// Round-robin among parents.
    RoundRobinParent,
    /// The parent CARP hashing picked for the URL (or the next highest when it failed).
    Carp,
}

impl HierCode {
    /// The name Squid prints.
    pub fn as_str(self) -> &'static str {
        match self {
            HierCode::None => "HIER_NONE",
            HierCode::Direct => "HIER_DIRECT",
            HierCode::SiblingHit => "SIBLING_HIT",
            HierCode::ParentHit => "PARENT_HIT",
            HierCode::CdSiblingHit => "CD_SIBLING_HIT",
            HierCode::CdParentHit => "CD_PARENT_HIT",
            HierCode::FirstParentMiss => "FIRST_PARENT_MISS",
            HierCode::ClosestParentMiss => "CLOSEST_PARENT_MISS",
            HierCode::SingleParent => "SINGLE_PARENT",
            HierCode::FirstUpParent => "FIRSTUP_PARENT",
            HierCode::DefaultParent => "DEFAULT_PARENT",
            HierCode::RoundRobinParent => "ROUNDROBIN_PARENT",
            HierCode::Carp => "CARP",
        }
    }

    /// The name as logged after an ICP wait that timed out (Squid prefixes `TIMEOUT_`).
    pub fn timeout_str(self) -> String {
        format!("TIMEOUT_{}", self.as_str())
    }
}
