//! Exposes the Ruby being built against as cfgs (`ruby_gte_3_3`, `ruby_lt_3_4`, `ruby_eq_3_1`,
//! `ruby_have_*`, ...) so version-dependent VM calls can be chosen at compile time. The values
//! come from rb-sys's build script (`links = "rb"`), which asks the `ruby` found through `RUBY`
//! or `PATH`.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    let _ = rb_sys_env::activate()?;
    Ok(())
}
