//! Pod networking for ferrolet (built-in bridge and CNI). Filled in by the networking issue.
