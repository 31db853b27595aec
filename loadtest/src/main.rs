fn main() {
    eprintln!("loadtest: under construction");
    std::process::exit(2);
}
