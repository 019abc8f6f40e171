// glibc's malloc took an eighth of `seckill serve`'s CPU under load (many
// small allocations across threads); mimalloc's thread-local heaps cost less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
