//! Who files belong to and whether this user may use them, for the messages of folders a
//! group shares (run directories, the data cache, model folders): they name the owner to ask.

use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `access(2)`: whether this user (its real ids, as the kernel checks) may use `path` so
/// (`libc::R_OK`, `W_OK`, `X_OK`, or them together).
pub fn may(path: &Path, how: libc::c_int) -> bool {
    CString::new(path.as_os_str().as_encoded_bytes()).is_ok_and(|c| {
        // SAFETY: a query of a NUL-terminated path that outlives the call.
        unsafe { libc::access(c.as_ptr(), how) == 0 }
    })
}

/// The real user id of this process.
pub fn current_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// The login name of `uid`, or the number where the system has no name for it.
pub fn user_name(uid: u32) -> String {
    // SAFETY: getpwuid_r writes into the buffers given; the result is read only on success.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc == 0 && !result.is_null() && !pwd.pw_name.is_null() {
            return std::ffi::CStr::from_ptr(pwd.pw_name)
                .to_string_lossy()
                .into_owned();
        }
        uid.to_string()
    }
}

/// Whose `path` is (by name) and its permission bits (`0o644`), for messages; `None` when
/// it cannot be looked at.
pub fn owner_and_mode(path: &Path) -> Option<(String, u32)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((user_name(meta.uid()), meta.mode() & 0o7777))
}

/// The login name of the user running this.
pub fn this_user() -> String {
    user_name(current_uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_named_by_login_and_unknown_ids_by_number() {
        assert_eq!(user_name(0), "root");
        assert_eq!(user_name(4_000_000_000), "4000000000");
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o2750)).unwrap();
        let (owner, mode) = owner_and_mode(dir.path()).unwrap();
        assert_eq!((owner, mode), (this_user(), 0o2750));
        assert!(owner_and_mode(&dir.path().join("absent")).is_none());
    }
}
