//! Framing and handshake. Owned by the controller work (issue 4): length-delimited frames
//! (4-byte big-endian length, `tokio_util::codec::LengthDelimitedCodec` compatible) with a
//! size limit, a [`crate::messages::Hello`] / [`crate::messages::HelloReply`] handshake with
//! a timeout, typed async connections for the controller and a blocking one for workers.
