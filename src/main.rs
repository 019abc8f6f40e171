fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
