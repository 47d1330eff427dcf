//! The sixteen posteriors of `../shared/posteriordb-more` (posteriordb models beyond the first
//! suite), one module per group of models. The suite folder is `PARVI_POSTERIORDB_MORE_DIR`, else
//! `$PARVI_DATA_DIR/../posteriordb-more`, else `../shared/posteriordb-more` beside the workspace.
//! Without it the tests print a note and pass, unless `PARVI_REQUIRE_POSTERIORDB=1`.

#[path = "posteriordb_more/more_3.rs"]
mod more_3;
