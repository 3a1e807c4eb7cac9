//! Helpers of the integration tests.
