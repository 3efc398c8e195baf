//! Rendezvous: turning an init method into a rank, a world size and a store.
