//! Nothing to build: this package only names the crate whose headers the plugin checks use.
