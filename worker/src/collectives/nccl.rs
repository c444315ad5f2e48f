//! NCCL backend (placeholder until the next commit).
use super::CommError;

pub struct NcclCommunicator;

pub fn new_unique_id() -> Result<Vec<u8>, CommError> {
    Err(CommError::Nccl("not built yet".into()))
}

impl NcclCommunicator {
    pub fn new(
        _id: &[u8],
        _rank: usize,
        _world: usize,
    ) -> Result<Box<dyn super::Communicator>, CommError> {
        Err(CommError::Nccl("not built yet".into()))
    }
}
