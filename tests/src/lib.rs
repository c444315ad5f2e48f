//! Harness for end-to-end tests: locate the built binaries, give each test its own temp
//! directory, run commands with deadlines, poll files.
