fn main() {
    println!("ferrolet: not built yet");
}
