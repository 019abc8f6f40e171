// The worker allocates for every entry it reads (the redis crate's reply
// values, the messages, the SQL): glibc's malloc and free took ~30% of its
// CPU in a drain; mimalloc is a fraction of that.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
